"""/v1/chat/completions: the request and reply models, the serving, tools (ToolPlan and the tool parsers)
and the reasoning split."""
