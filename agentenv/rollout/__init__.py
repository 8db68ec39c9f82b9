"""agentenv.rollout"""
