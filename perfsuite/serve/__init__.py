"""``perfsuite serve``: perfsuite's in-flight or paged engine behind an OpenAI-compatible HTTP API.

One job per module, dependencies pointing down the list:

- ``launch``: the command line's options; loads the model and runs the server.
- ``server_thread``: a server on a background thread (tests, notebooks).
- ``app``: the aiohttp handlers (``/v1/completions``, ``/v1/chat/completions``,
  ``/health``, ``/v1/models``, ``/metrics``) and SSE streaming.
- ``request_log``: one log line per HTTP request.
- ``metrics``: ``/metrics`` in Prometheus' text format, under vLLM's names;
  ``histograms``: its latency and length histograms, with vLLM's buckets.
- ``responses``: the JSON bodies and SSE framing of (chat) completion answers.
- ``worker``: the engine's one thread and each HTTP request's token stream.
- ``completion_request``: a completion or chat body, checked against an
  allow-list of fields and validated.
- ``chat_messages``: chat messages, checked and rendered with the chat template.
- ``json_body``: the raw body as JSON, every malformed input a 400.
- ``detokenizer``: token ids to text pieces, one per token.
- ``errors``, ``limits``: OpenAI-style errors; the bounds on a server.

Everything is bounded: at most ``max_open_requests`` engine requests are open
(a request with several prompts counts one per prompt; more get 429), prompt +
``max_tokens`` must fit ``max_seq_len``, bodies are capped in size and depth,
a client that disconnects has its requests aborted and their slots freed, and
the engine's records and step traces are taken after every step, so a server
under a load that never lets it go idle keeps a bounded history.
"""

from perfsuite.serve.app import CompletionServer
from perfsuite.serve.launch import ServeOptions, build_server, serve
from perfsuite.serve.limits import ServeLimits
from perfsuite.serve.server_thread import ServerThread

__all__ = ["CompletionServer", "ServeLimits", "ServeOptions", "ServerThread", "build_server", "serve"]
