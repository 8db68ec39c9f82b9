"""agentenv.algorithms"""
