"""What every model family's generated AFD classes share: the role plan, the remote proxies, role-aware
weight loading and the FFN entry points (one overlay per family calls them; docs/maintainers.md)."""
