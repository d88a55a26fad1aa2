"""A gRPC server built as the retriever builds its own — `GrpcServer` with a token and the receive limit
of the retriever's default request bounds (12.6 MB) — serving the retriever's `Search` with an answer of
one hit per query (no index: the test is about what reaches the servicer), in a process of its own so a
test can read its RSS: `python tests/support/auth_flood_server.py TOKEN [--read-before-auth]` prints the
address and serves until killed.

`--read-before-auth` is the baseline: the token check refuses a call with a unary handler, which gRPC
calls only once it has received the whole request message (up to the receive limit)."""

from __future__ import annotations

import argparse
import asyncio

import grpc

from searchr1.core import auth
from searchr1.core.api import retriever_pb2, retriever_pb2_grpc
from searchr1.core.servers import GrpcServer
from searchr1.retriever.settings import RetrieverSettings


class Echo(retriever_pb2_grpc.RetrieverServicer):
    async def Search(self, request, context):  # noqa: N802 - the generated name
        hits = [retriever_pb2.QueryHits(hits=[retriever_pb2.Hit(doc_id=str(len(q)))]) for q in request.queries]
        return retriever_pb2.SearchResponse(results=hits)


def read_before_auth() -> None:
    """Make `BearerAuthInterceptor` refuse with a unary handler (the message is read before it runs)."""
    async def deny(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")

    init = auth.BearerAuthInterceptor.__init__

    def patched(self, token, **kwargs):
        init(self, token, **kwargs)
        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    auth.BearerAuthInterceptor.__init__ = patched  # type: ignore[method-assign]


async def serve(token: str) -> None:
    server = GrpcServer(token=token, max_receive_bytes=RetrieverSettings().limits.request_bytes())
    server.add(retriever_pb2_grpc.add_RetrieverServicer_to_server, Echo(),
               retriever_pb2.DESCRIPTOR.services_by_name["Retriever"].full_name)
    port = await server.start()
    print(f"127.0.0.1:{port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("token")
    parser.add_argument("--read-before-auth", action="store_true")
    args = parser.parse_args()
    if args.read_before_auth:
        read_before_auth()
    asyncio.run(serve(args.token))
