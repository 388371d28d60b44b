"""The `llmvalve` subcommands, one module each: `add_arguments(parser)` and `run(args) -> int`.
`llmvalve.cli` dispatches to them. Heavy imports (grpc, aiohttp) stay inside `run`."""
