"""An agent's MCP session, with the official Python SDK (`mcp` from PyPI), for the tests in
tests/node/agents-mcp.test.mjs: connects to URL with TOKEN, lists the tools, then makes the
calls given as JSON ([[name, arguments], ...]) and prints one JSON line with the tool names and
each call's result ({"error": bool, "text": ...})."""
import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client


async def main(url, token, calls):
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http:
        async with streamable_http_client(url, http_client=http) as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = await session.list_tools()
                results = []
                for name, arguments in calls:
                    r = await session.call_tool(name, arguments)
                    text = "".join(getattr(c, "text", "") for c in r.content)
                    error = getattr(r, "is_error", None)
                    if error is None:
                        error = getattr(r, "isError", False)
                    results.append({"error": bool(error), "text": text})
                print(json.dumps({"tools": [t.name for t in tools.tools], "results": results}))


asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3])))
