"""The admission benchmark's stage profile (``tests.bench.admission_profile``) puts each py-spy
stack where it belongs: the first matching stage, else by its innermost frame; the log writer at
rest is no sample."""

from __future__ import annotations

from tests.bench import admission_profile

LOOP = "run_forever (asyncio/base_events.py:608);_run_once (asyncio/base_events.py:1922)"
THREAD = "_bootstrap (threading.py:995);run (threading.py:975)"
HANDLER = f"{LOOP};_run (asyncio/events.py:80);serve (bootstrap/service/webhook/app.py:140)"
RAW = "\n".join(
    [
        f"{HANDLER};validate (admission/webhook.py:190);decide (admission/decision/decider.py:120) 7",
        f"{HANDLER};validate (admission/webhook.py:200);log_decision (admission/webhook.py:150);"
        "makeRecord (logging/__init__.py:1600) 3",
        f"{HANDLER};validate (admission/webhook.py:180);read_review (admission/reading/review.py:150) 2",
        f"{HANDLER};validate (admission/webhook.py:200);AuditLog.__call__ (bootstrap/logs/audit.py:60) 1",
        f"{HANDLER};validate (admission/webhook.py:205);key (admission/decision/decisioncache.py:100) 1",
        f"{LOOP};_read_ready (asyncio/selector_events.py:900);"
        "buffer_updated (asyncio/sslproto.py:400);read (ssl.py:900) 4",
        f"{LOOP};select (selectors.py:468) 5",
        f"{THREAD};BatchHandler._run (bootstrap/logs/batch.py:73) 9",
        f"{THREAD};BatchHandler._run (bootstrap/logs/batch.py:80);"
        "BatchHandler.flush (bootstrap/logs/batch.py:90) 2",
        "main (tests/bench/admission_server.py:130);"
        f"{HANDLER.replace('bootstrap/service/webhook/app.py', 'aiohttp/web_app.py')};"
        "bare_app.<locals>.validate (tests/bench/admission_server.py:60) 6",
        "not a line",
    ]
)


def test_each_stack_goes_to_its_stage() -> None:
    found = admission_profile.stages(RAW)
    assert found == {
        "the decision (Decider.decide)": 7,
        "logging (record, format, write)": 6,  # the writer's flush counts, its rest does not
        "reading the review (JSON, envelope)": 2,
        "decision cache": 1,
        "TLS (ssl, sslproto)": 4,
        "event loop (asyncio, epoll)": 5,
        "webhook handler, rest (web.Response, ...)": 6,  # the bare handler, not its process's main()
    }


# Since issue 35 the listener frames requests itself (TLS, the listener's connection, the
# protocol) and judges each in a task.
TLS_IN = f"{LOOP};_read_ready (asyncio/selector_events.py:952);buffer_updated (asyncio/sslproto.py:439)"
CONN = f"{TLS_IN};Connection.data_received (bootstrap/service/http/listener.py:211)"
PROTO = f"{CONN};ReviewProtocol.data_received (bootstrap/service/webhook/protocol.py:137)"
EAGER = f"{LOOP};_run (asyncio/events.py:80);ReviewApp.answer (bootstrap/service/webhook/app.py:215)"
LISTENER_RAW = "\n".join(
    [
        f"{EAGER};validate (admission/webhook.py:235);Decider.decide (admission/decision/decider.py:156) 5",
        f"{EAGER};validate (admission/webhook.py:217);read_review (admission/reading/review.py:163) 3",
        f"{EAGER};_Lane.take (bootstrap/service/webhook/app.py:90) 1",
        f"{PROTO};ReviewProtocol._next (bootstrap/service/webhook/protocol.py:171);"
        "parse_head (bootstrap/service/http/framing.py:128) 2",
        f"{CONN};Connection._arm (bootstrap/service/http/listener.py:330) 1",
        f"{TLS_IN};SSLObject.read (ssl.py:921) 4",
        f"{EAGER};BareReviews.answer (tests/bench/admission_server.py:80) 2",
    ]
)


def test_the_listeners_stacks_go_to_their_stages() -> None:
    assert admission_profile.stages(LISTENER_RAW) == {
        "the decision (Decider.decide)": 5,
        "reading the review (JSON, envelope)": 3,
        "review slots, routes (webhook app)": 1,
        "HTTP framing (nodegate's listener)": 2,
        "listener (connections, deadlines)": 1,
        "TLS (ssl, sslproto)": 4,
        "webhook handler, rest (web.Response, ...)": 2,
    }
