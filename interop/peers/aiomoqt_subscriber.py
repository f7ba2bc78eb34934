"""aiomoqt subscriber: FETCH or SUBSCRIBE one track of a moqt:// URI and report what arrived.

Run by the interop venv (Python 3.12, aiomoqt 0.13.3)::

    python interop/peers/aiomoqt_subscriber.py moqt://127.0.0.1:4433/kvsp --ca ca.pem --draft 16 \
        --token HEX --mode fetch --namespace 6b767370,... --track raw --layers 8 --k-size 1024 --v-size 1024

Authenticates with the AUTHORIZATION TOKEN setup parameter (aiomoqt wraps the value as Token Type 0,
USE_VALUE) when --token is given; verifies the server certificate against --ca; offers the ALPN of
--draft only (14: moq-00, 16: moqt-16, 18: moqt-18), or with ``--draft all`` aiomoqt's default offer,
newest first. Reports, as one ``@interop`` line of kind ``result``: ``ok``, the ``draft`` the
handshake agreed, the ``stage`` that failed (setup / request / data), the session close code and
reason, the answer to the request and every object (hex payload).
"""

from __future__ import annotations

import argparse
import asyncio
import time

from _common import (
    add_block_args,
    add_draft_arg,
    block_from,
    emit,
    object_json,
    parse_moqt_uri,
    quiet_logging,
    supported_drafts,
)
from aiomoqt.client import MOQTClient
from aiomoqt.types import FilterType, MOQTException, MOQTRequestError, ObjectStatus, SetupParamType


def _close_info(session: object) -> dict[str, object]:
    err = getattr(session, "_close_err", None)
    if not err:
        return {}
    code, reason = err[0], err[1]
    if isinstance(reason, bytes | bytearray):
        reason = bytes(reason).decode(errors="replace")
    return {"close_code": int(code), "close_reason": str(reason)}


async def run(args: argparse.Namespace) -> dict[str, object]:
    block = block_from(args)
    host, port, path = parse_moqt_uri(args.uri)
    client = MOQTClient(host, port, path=path, use_quic=True, ca_file=args.ca,
                        supported_drafts=supported_drafts(args))
    setup = {SetupParamType.AUTH_TOKEN: bytes.fromhex(args.token)} if args.token else None
    objects: list[dict[str, object]] = []
    report: dict[str, object] = {"ok": False, "mode": args.mode, "objects": objects}
    complete = asyncio.Event()

    def normal_count() -> int:
        return sum(1 for o in objects if o["status"] == ObjectStatus.NORMAL)

    async with client.connect() as session:
        try:
            await session.client_session_init(timeout=args.timeout, parameters=setup)
        except (MOQTException, OSError, ConnectionError) as exc:
            report.update(stage="setup", error=f"{type(exc).__name__}: {exc}", draft=session.negotiated_draft,
                          **_close_info(session))
            return report
        report["draft"] = session.negotiated_draft  # from the ALPN the handshake agreed
        ns, name = block.namespace, block.track
        try:
            if args.mode == "fetch":
                def on_fetch_object(msg, size, now_us, request_id=None):
                    objects.append(object_json(msg.group_id, msg.subgroup_id, msg.object_id, status=msg.status,
                                               payload=msg.payload, extensions=msg.extensions, recv_us=now_us))

                # End Location is the last object plus 1 (draft-14 section 9.16; the same in 16 and 18).
                reply = await session.fetch(ns, name, start_group=0, start_object=0, end_group=0,
                                            end_object=block.layers, on_object=on_fetch_object, wait_response=True)
                report["reply"] = type(reply).__name__
                finished = await session.await_fetch_done(reply.request_id, timeout=args.timeout)
                report["fetch_stream_fin"] = bool(finished)
            else:
                done: dict[str, object] = {}

                def on_object(msg, size, now_us, group_id=None, subgroup_id=None):
                    objects.append(object_json(group_id, subgroup_id, msg.object_id, status=msg.status,
                                               payload=msg.payload, extensions=msg.extensions, recv_us=now_us))
                    if normal_count() >= block.layers and done:
                        complete.set()

                def on_done(msg):
                    done.update(status_code=int(msg.status_code), stream_count=int(msg.stream_count),
                                reason=str(msg.reason))
                    if normal_count() >= block.layers:
                        complete.set()

                reply = await session.subscribe(ns, name, filter_type=FilterType(args.filter), on_object=on_object,
                                                on_done=on_done, wait_response=True)
                report["reply"] = type(reply).__name__
                report["subscribed_us"] = int(time.time() * 1_000_000)
                try:
                    await asyncio.wait_for(complete.wait(), args.timeout)
                except TimeoutError:
                    report.update(stage="data", error=f"timed out with {normal_count()} objects")
                report["publish_done"] = done
        except MOQTRequestError as exc:
            report.update(stage="request", error=f"{type(exc).__name__}: {exc}", error_code=exc.error_code,
                          reason=exc.reason, **_close_info(session))
            return report
        if "stage" not in report:
            report["ok"] = normal_count() == block.layers
            if not report["ok"]:
                report.update(stage="data", error=f"{normal_count()} of {block.layers} objects")
        report.update(_close_info(session))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("uri")
    parser.add_argument("--ca", required=True)
    parser.add_argument("--token", default="", help="AUTHORIZATION TOKEN value, hex (absent: none sent)")
    parser.add_argument("--mode", choices=("fetch", "subscribe"), required=True)
    parser.add_argument("--filter", type=int, default=int(FilterType.LATEST_OBJECT),
                        help="SUBSCRIBE filter type (default 0x2, Largest Object)")
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--debug", action="store_true")
    add_draft_arg(parser)
    add_block_args(parser)
    args = parser.parse_args()
    quiet_logging(args.debug)
    try:
        report = asyncio.run(asyncio.wait_for(run(args), args.timeout * 2))
    except Exception as exc:  # an aiomoqt failure is a result too, never a traceback the harness must parse
        report = {"ok": False, "stage": "crash", "error": f"{type(exc).__name__}: {exc}"}
    emit("result", **report)


if __name__ == "__main__":
    main()
