"""agentenv.training"""
