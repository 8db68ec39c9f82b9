"""`agentenv view`: a local web page over a run or a bench folder (`server`), reading it tolerantly (`loader`)."""
