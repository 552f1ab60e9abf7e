"""`fisk-sm mcp-serve`: an agent served as an MCP tool (the `fisk-sm[mcp]` extra).

Imported only by that command. Pinned to the MCP revision 2026-07-28, which the installed `mcp`
2.x SDK speaks (`mcp_types.version.LATEST_PROTOCOL_VERSION`).
"""
