"""Real servers for the upstream tests: engines under uvicorn and aiohttp, and a raw socket
server whose bytes a test writes itself (misbehaviour the HTTP libraries would not produce)."""
