"""``perfsuite serve``: the in-flight engine behind an OpenAI-compatible HTTP API.

One job per module, dependencies pointing down the list:

- ``launch``: the command line's options; loads the model and runs the server.
- ``server_thread``: a server on a background thread (tests, notebooks).
- ``app``: the aiohttp handlers, SSE streaming, ``/health``, ``/v1/models``.
- ``responses``: the JSON bodies and SSE framing of completion answers.
- ``worker``: the engine's one thread and each request's token stream.
- ``completion_request``: a ``/v1/completions`` body, parsed and validated.
- ``detokenizer``: token ids to text pieces, one per token.
- ``errors``, ``limits``: OpenAI-style errors; the bounds on a server.

Everything is bounded: at most ``max_open_requests`` requests are open (more
get 429), prompt + ``max_tokens`` must fit ``max_seq_len``, bodies are capped,
and a client that disconnects has its request aborted and its slot freed.
"""

from perfsuite.serve.app import CompletionServer
from perfsuite.serve.launch import ServeOptions, build_server, serve
from perfsuite.serve.limits import ServeLimits
from perfsuite.serve.server_thread import ServerThread

__all__ = ["CompletionServer", "ServeLimits", "ServeOptions", "ServerThread", "build_server", "serve"]
