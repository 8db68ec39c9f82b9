"""agentenv.envs"""
