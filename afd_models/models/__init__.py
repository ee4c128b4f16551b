"""Hand-written AFD model logic the generated DeepSeek subclasses call: the role plan and the remote proxies."""
