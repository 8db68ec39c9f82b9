"""agentenv.bench"""
