"""The judged evaluation (components/evaluate/judge.py): a judge at an OpenAI-compatible endpoint scores base and tuned
answers on a rubric. Against a judge server whose score follows the answer (so scores must change when the answers
do), one that replies in every shape a model does (code fences, thinking, a bare score, nothing readable), and the
real local server (`transformers serve` on the tiny model, as the run starts it) as ``served-base``; the gate; and the
bad input the validate step refuses before any GPU."""

from __future__ import annotations

import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from components.evaluate import judge as J
from components.settings import Settings
from components.validate.rules import check

PROMPTS = [
    [{"role": "user", "content": "What is a Kubernetes DaemonSet?"}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "HPA가 무엇인가요?"}],
    [{"role": "user", "content": "What is gradient clipping?"}],
]
GOOD = [
    "A DaemonSet runs one pod on every node: good good good.",
    "수평 확장: good good.",
    "It bounds gradients: good.",
]
POOR = ["banana", "banana", "banana"]


def _score_of(answer: str) -> int:
    """The fake judge's rubric: one point, plus two per 'good', at most 10."""
    return min(10, 1 + 2 * answer.count("good"))


class JudgeServer:
    """An OpenAI-compatible judge that scores the answer it is shown (``_score_of``) and replies as ``style(score,
    answer)`` says; it records each request's body and Authorization header."""

    def __init__(self, style=lambda score, answer: json.dumps({"score": score, "reason": f"saw {answer[:10]}"})):
        self.requests: list[tuple[dict, str | None]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self._send(200, {"object": "list", "data": [{"id": "judge-1", "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((body, self.headers.get("Authorization")))
                text = body["messages"][-1]["content"]
                answer = re.search(r"Answer to judge:\n<answer>\n(.*)\n</answer>\n\nReply with exactly", text, re.S)[1]
                content = style(_score_of(answer), answer)
                self._send(200, {"object": "chat.completion", "choices": [{"index": 0, "message": {
                    "role": "assistant", "content": content}}]})  # fmt: skip

            def _send(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def _judge(url: str, answers: dict, **kwargs) -> dict:
    rubric = J.load_rubric(J.BUILTIN_RUBRIC)
    return J.judge_answers(url, "judge-1", rubric, PROMPTS, answers, max_tokens=64, **kwargs)


def test_the_judges_scores_change_when_the_answers_do():
    with JudgeServer() as server:
        good_vs_poor = _judge(server.url, {"base": POOR, "tuned": GOOD})
        poor_vs_poor = _judge(server.url, {"base": POOR, "tuned": POOR})
    tuned = [item["tuned"]["score"] for item in good_vs_poor["items"]]
    assert tuned == [7.0, 5.0, 3.0]  # each answer's own score, in prompt order
    assert [item["tuned"]["score"] for item in poor_vs_poor["items"]] == [1.0, 1.0, 1.0]
    assert good_vs_poor["summary"]["tuned"]["mean_score"] == pytest.approx(5.0)
    assert good_vs_poor["summary"]["base"]["mean_score"] == 1.0
    assert good_vs_poor["summary"]["win_rate"] == 1.0 and good_vs_poor["summary"]["wins"] == 3
    assert poor_vs_poor["summary"]["win_rate"] == 0.5 and poor_vs_poor["summary"]["ties"] == 3  # a tie counts half
    assert good_vs_poor["items"][0]["tuned"]["reason"] == "saw A DaemonSe"
    assert good_vs_poor["items"][1]["prompt"] == "HPA가 무엇인가요?"
    # The judge saw the rubric's criteria, the whole conversation (system turn too) and one answer, at temperature 0.
    body = server.requests[0][0]
    assert body["model"] == "judge-1" and body["temperature"] == 0 and body["max_tokens"] == 64
    shown = "\n".join(m["content"] for body, _ in server.requests for m in body["messages"])
    assert "helpfulness" in shown and "instruction_following" in shown and "[system]\nAnswer briefly." in shown


@pytest.mark.parametrize(
    ("reply", "score", "reason"),
    [
        ('{"score": 7, "reason": "clear"}', 7.0, "clear"),
        ('Here:\n```json\n{"score": 8, "reason": "fenced"}\n```', 8.0, "fenced"),
        ('<think>maybe {"score": 2}</think>\n{"score": "6", "reason": "after thinking"}', 6.0, "after thinking"),
        ('{"scores": {"helpfulness": 4, "correctness": 6}, "reason": "mean"}', 5.0, "mean"),
        ('{"note": 1} then {"score": 9.5, "explanation": "second object"}', 9.5, "second object"),
        ("Score: 3/10, too short", 3.0, "Score: 3/10, too short"),
    ],
)
def test_a_verdict_is_read_from_every_shape_a_judge_replies_in(reply, score, reason):
    verdict = J.parse_verdict(reply, (1.0, 10.0))
    assert verdict is not None and verdict["score"] == score and verdict["reason"] == reason


@pytest.mark.parametrize("reply", ["", "I cannot judge this.", '{"score": 11}', '{"score": true}', "{not json"])
def test_a_reply_with_no_score_on_the_scale_is_not_a_verdict(reply):
    assert J.parse_verdict(reply, (1.0, 10.0)) is None


def test_replies_that_do_not_parse_are_counted_not_a_crash_and_shown_in_the_report():
    def style(score, answer):  # the judge rambles for every poor answer
        return "I think it is fine." if answer == "banana" else f'```\n{{"score": {score}, "reason": "ok"}}\n```'

    with JudgeServer(style) as server:
        judged = _judge(server.url, {"base": POOR, "tuned": GOOD[:2] + ["banana"]})
    summary = judged["summary"]
    assert summary["base"] == {"mean_score": None, "judged": 0, "unparsed": 3, "errors": 0}
    assert summary["tuned"] == {"mean_score": 6.0, "judged": 2, "unparsed": 1, "errors": 0}
    assert summary["win_rate"] is None  # no prompt with both answers judged
    assert judged["items"][2]["tuned"] == {
        "score": None, "reason": "I think it is fine.", "scores": {}, "error": "unparsed"
    }  # fmt: skip
    assert J.judge_metrics(judged) == {"judge_score": 6.0, "judge_unjudged": 4.0}
    report = "\n".join(J.judge_section(judged, str))
    assert "| base | n/a | 0 | 3 | 0 |" in report and "| tuned | 6.00 | 2 | 1 | 0 |" in report
    assert "| 3 | What is gradient clipping? | not judged | I think it is fine. | not judged |" in report


def test_the_gate_names_the_setting_and_the_figure():
    with JudgeServer() as server:
        judged = _judge(server.url, {"base": POOR, "tuned": GOOD})
    ok, line = J.judge_gate(judged)
    assert ok and line == "judge score 1.00 -> 5.00 (of 1-10), tuned wins 100% (3 won, 0 tied, 0 lost)"
    assert J.judge_gate(judged, min_judge_score=5, min_judge_win_rate=1.0)[0]
    ok, line = J.judge_gate(judged, min_judge_score=6.5)
    assert not ok and "mean judge score 5.00 is below min_judge_score=6.5" in line
    reversed_ = {**judged, "summary": {**judged["summary"], "win_rate": 0.25, "wins": 0, "ties": 1, "losses": 2}}
    ok, line = J.judge_gate(reversed_, min_judge_win_rate=0.5)
    assert not ok and "win rate over the base 0.25 is below min_judge_win_rate=0.5" in line
    nothing = {**judged, "summary": {**judged["summary"], "tuned": {"mean_score": None, "judged": 0, "unparsed": 3,
               "errors": 0}}}  # fmt: skip
    ok, line = J.judge_gate(nothing, min_judge_score=1)
    assert not ok and "n/a is below min_judge_score=1" in line and "3 tuned answers not judged" in line


def test_the_key_comes_from_the_environment_and_a_failed_request_is_counted(monkeypatch):
    monkeypatch.setenv("JUDGE_API_KEY", "sk-test")
    with JudgeServer() as server:
        judged = J.run_judge(
            {"endpoint": server.url, "model": "judge-1", "rubric": J.BUILTIN_RUBRIC, "max_tokens": 32},
            base_model="/models/base",
            prompts=PROMPTS,
            answers={"base": POOR, "tuned": GOOD},
        )
        assert {auth for _, auth in server.requests} == {"Bearer sk-test"}
    assert judged["endpoint"] == server.url and judged["summary"]["tuned"]["judged"] == 3 and judged["seconds"] >= 0
    # A judge that answers some requests and not others: the failures are counted, with the error.
    calls = []
    real = J.ask_judge

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) % 2:
            raise OSError("connection reset")
        return real(*args, **kwargs)

    monkeypatch.setattr(J, "ask_judge", flaky)
    with JudgeServer() as server:
        judged = _judge(server.url, {"tuned": GOOD})
    assert sum(item["tuned"]["error"] == "connection reset" for item in judged["items"]) == 2
    assert judged["summary"]["tuned"]["errors"] == 2


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_judge_that_answers_no_request_fails_naming_judge_endpoint():
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    with pytest.raises(RuntimeError, match=r"judge_endpoint='http://127\.0\.0\.1:\d+/v1': not one of 6 judge requests"):
        _judge(url, {"base": POOR, "tuned": GOOD}, endpoint=url)


def test_a_user_rubric_sets_the_criteria_and_the_scale(tmp_path):
    path = tmp_path / "rubric.json"
    path.write_text(json.dumps({"criteria": [{"name": "politeness", "description": "Is it polite?"}], "scale": [0, 5]}))
    rubric = J.load_rubric(str(path))
    assert rubric["criteria"] == {"politeness": "Is it polite?"} and rubric["scale"] == (0.0, 5.0)
    text = J.judge_messages(rubric, PROMPTS[0], "Sure.")[-1]["content"]
    assert "- politeness: Is it polite?" in text and '"politeness": <0-5>' in text
    assert J.parse_verdict('{"score": 7}', rubric["scale"]) is None  # off this rubric's scale
    plain = tmp_path / "rubric.md"
    plain.write_text("Reward answers that cite a source.")
    assert J.load_rubric(str(plain))["text"] == "Reward answers that cite a source."
    for bad, message in [
        ("missing.json", "is not a file"),
        ('{"criteria": {}}', "'criteria' must be a non-empty object"),
        ('{"criteria": {"a": "b"}, "scale": [5, 1]}', "'scale' must be \\[low, high\\]"),
        ("[1, 2", "not JSON"),
    ]:
        source = str(tmp_path / bad) if bad.endswith(".json") else str(tmp_path / "bad.json")
        if not bad.endswith(".json"):
            (tmp_path / "bad.json").write_text(bad)
        with pytest.raises(ValueError, match=f"judge_rubric: .*{message}"):
            J.load_rubric(source)


# --- bad input, refused by the validate step before any GPU ---------------------------------------------------------


def _errors(**values) -> list[str]:
    return check(Settings().flat() | values)


def _local(**values) -> dict:
    from pipelines import params

    return {**params.resolve("local-tiny"), **values}


def test_judge_settings_out_of_range_or_inconsistent_are_refused_naming_the_setting(tmp_path):
    assert _errors() == [] and _errors(judge_endpoint="https://judge.example/v1", judge_model="m") == []
    assert any("min_judge_win_rate" in e for e in _errors(judge_endpoint="j", min_judge_win_rate=1.5))
    assert any("min_judge_score" in e for e in _errors(judge_endpoint="j", min_judge_score=-1))
    assert any(
        "min_judge_score=11 is outside judge_rubric's scale 1-10" in e
        for e in _errors(judge_endpoint="judge", min_judge_score=11)
    )
    assert any("judge_endpoint is empty" in e for e in _errors(min_judge_win_rate=0.5))
    assert any("name the judge's model in judge_model" in e for e in _errors(judge_endpoint="https://x.example/v1"))
    assert any("train_backend=local" in e for e in _errors(judge_endpoint="served-base"))
    assert any("neither served-base" in e for e in _errors(judge_endpoint="Not A Name"))
    assert check(_local(judge_endpoint="served-base", min_judge_score=6)) == []
    assert [e for e in check(_local(judge_endpoint="judge")) if "a local run cannot reach" in e]
    assert [
        e
        for e in check(_local(judge_endpoint="served-base", judge_rubric=str(tmp_path / "none.json")))
        if e.startswith("judge_rubric:")
    ]


def _validate(**values):
    from components.validate.checks import validate

    return validate(_local(**values))


def test_a_judge_endpoint_that_does_not_answer_is_one_error_naming_it_before_training():
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    with pytest.raises(ValueError) as refused:
        _validate(judge_endpoint=url, judge_model="judge-1")
    message = str(refused.value)
    assert message.startswith(f"invalid settings: judge_endpoint={url!r} does not answer at {url}/models")
    assert message.count("judge_endpoint") == 2  # one error, with its fix


def test_a_judge_that_accepts_but_never_answers_times_out_quickly():
    with socket.socket() as silent:  # listens, never answers: the connection opens, no reply comes
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        problem = J.endpoint_problem(f"http://127.0.0.1:{silent.getsockname()[1]}/v1", timeout=0.5)
    assert problem is not None and "does not answer" in problem and "within 0.5s" in problem


def test_an_answering_judge_passes_and_a_model_it_does_not_serve_is_named():
    with JudgeServer() as server:
        assert J.endpoint_problem(server.url, "judge-1") is None
        assert J.endpoint_problem(server.url, "other") == (
            f"judge_model='other' is not served at {server.url} (it serves: judge-1)"
        )
        assert _validate(judge_endpoint=server.url, judge_model="judge-1").settings["judge_endpoint"] == server.url
    assert J.endpoint_problem("") is None and J.endpoint_problem("served-base") is None  # nothing to ask up front
    assert J.endpoint_url("my-judge", "team-a") == "http://my-judge-predictor.team-a.svc.cluster.local/v1"


# --- in the evaluation step -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny model and a small prepared dataset of its own (base and 'tuned' are the same model here)."""
    from components.data.prepare import PrepareOptions, prepare
    from components.models.tiny import materialize

    root = tmp_path_factory.mktemp("judge")
    base = materialize(str(root / "cache"))
    corpus = root / "chat.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"Say {w}."}, {"role": "assistant", "content": f"{w}."}]}
        for w in [f"{w}{i}" for i in range(4) for w in ("apple", "river", "cloud", "stone")]
    ]
    corpus.write_text("\n".join(json.dumps(r) for r in rows))
    prepare(
        str(corpus), base, str(root / "data"), PrepareOptions(max_seq_length=64, eval_size=4, seed=0, packing=False)
    )
    prompts = root / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"messages": m}) for m in PROMPTS[:2]))
    return {"base": base, "data": str(root / "data"), "prompts": str(prompts)}


def test_the_evaluation_step_judges_both_models_reports_each_verdict_and_gates_on_it(tiny, monkeypatch):
    from components.evaluate import base_vs_tuned as E

    monkeypatch.setattr(E, "gate", lambda *a, **k: (True, "eval_loss fine"))  # the judge's gate alone decides

    def run(server, **gates):
        judge = {"endpoint": server.url, "model": "judge-1", "rubric": J.BUILTIN_RUBRIC, "max_tokens": 32}
        judge |= {"min_judge_score": 0.0, "min_judge_win_rate": 0.0, **gates}
        options = E.EvalOptions(4, 0.0, eval_prompts=tiny["prompts"], max_new_tokens=4)
        return E.evaluate(tiny["base"], tiny["base"], tiny["data"], options, judge=judge)

    with JudgeServer() as server:
        ungated = run(server)
        gated = run(server, min_judge_win_rate=0.75)
    # The tiny model's answers hold no 'good': 1 point each, every prompt a tie.
    judged = {k: ungated["metrics"][k] for k in ("judge_score", "base_judge_score", "judge_win_rate", "judge_unjudged")}
    assert judged == {"judge_score": 1.0, "base_judge_score": 1.0, "judge_win_rate": 0.5, "judge_unjudged": 0.0}
    assert ungated["passed"] and ungated["reason"].startswith("eval_loss fine; judge score 1.00 -> 1.00 (of 1-10)")
    assert [item["tuned"]["score"] for item in ungated["judge"]["items"]] == [1.0, 1.0]
    report = ungated["report"]
    assert "## Judged answers" in report and "| 1 | What is a Kubernetes DaemonSet? | 1 | saw " in report
    assert not gated["passed"] and "is below min_judge_win_rate=0.75" in gated["reason"]
    assert gated["reason"].endswith("; not deploying") and "**NOT PASSED**" in gated["report"]


def test_a_bad_rubric_fails_the_evaluation_before_any_model_loads(tmp_path):
    from components.evaluate.base_vs_tuned import EvalOptions, evaluate

    judge = {"endpoint": "served-base", "rubric": str(tmp_path / "none.json")}
    with pytest.raises(ValueError, match="judge_rubric: .* is not a file"):
        evaluate("/no/base", "/no/tuned", "/no/data", EvalOptions(0, 0.0), judge=judge)


# --- the real local server as the judge ---------------------------------------------------------------------------


@pytest.mark.slow
def test_the_runs_local_server_judges_as_served_base(tmp_path):
    """`transformers serve` on the tiny (random) model judges: its verdicts are noise, so only the mechanics are held:
    every answer gets a request that succeeds, a score on the scale or an unparsed reply kept as the reason, and the
    server is gone after."""
    from components.models.tiny import materialize

    base = materialize(str(tmp_path / "cache"))
    config = {
        "endpoint": "served-base",
        "model": "",
        "rubric": J.BUILTIN_RUBRIC,
        "max_tokens": 16,
        "log_dir": str(tmp_path),
    }
    judged = J.run_judge(config, base_model=base, prompts=PROMPTS[:2], answers={"base": POOR[:2], "tuned": GOOD[:2]})
    assert judged["model"] == base and judged["endpoint"] == "served-base" and len(judged["items"]) == 2
    for item in judged["items"]:
        for role in ("base", "tuned"):
            v = item[role]
            assert v["error"] in ("", "unparsed"), v  # the server answered every request
            assert (v["score"] is None and v["error"] == "unparsed" and v["reason"]) or 1 <= v["score"] <= 10
    for role in ("base", "tuned"):
        s = judged["summary"][role]
        assert s["errors"] == 0 and s["judged"] + s["unparsed"] == 2
    assert (tmp_path / "judge_serve.log").exists()
    assert _servers_of(base) == []  # stopped after the judging


def _servers_of(model: str) -> list[int]:
    """Pids of live `transformers serve` processes of ``model``."""
    from pathlib import Path

    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
                status = (entry / "status").read_text()
            except OSError:
                continue
            if b"serve" in cmdline and model.encode() in cmdline and "State:\tZ" not in status:
                pids.append(int(entry.name))
    return pids


def test_the_judge_settings_reach_the_evaluation_and_its_verdicts_are_recorded(tmp_path, monkeypatch):
    from components.evaluate import base_vs_tuned as evaluate_module
    from components.evaluate.run import evaluate_tuned_model, judge_config
    from components.models import resolve
    from components.paths import evaluation_path

    flat = Settings().flat() | {"judge_endpoint": "https://j.example/v1", "judge_model": "big", "min_judge_score": 6.0}
    s = Settings.from_flat(flat)
    assert judge_config(Settings(), log_dir="/x") is None  # not judged by default
    assert judge_config(s, log_dir="/x") == {
        "endpoint": "https://j.example/v1", "model": "big", "rubric": "builtin:default", "max_tokens": 256,
        "log_dir": "/x", "min_judge_score": 6.0, "min_judge_win_rate": 0.0, "min_judged_fraction": 0.9,
    }  # fmt: skip
    model = tmp_path / "models" / "runs" / "r1" / "train" / "final"
    model.mkdir(parents=True)
    verdicts = {"items": [], "summary": {}}
    seen = {}

    def evaluate(*args, judge=None, **kwargs):
        seen["judge"] = judge
        return {"metrics": {}, "passed": True, "reason": "ok", "prompts": [], "answers": {"base": [], "tuned": []},
                "report": "# Evaluation", "judge": verdicts}  # fmt: skip

    monkeypatch.setattr(evaluate_module, "evaluate", evaluate)
    monkeypatch.setattr(resolve, "resolve_model", lambda name, cache: f"{cache}/{name}")
    monkeypatch.setattr("components.langfuse_trace.trace_evaluation", lambda **kwargs: None)
    evaluate_tuned_model(s, model_path=str(model), dataset_path=str(tmp_path / "d"), data_root=str(tmp_path))
    assert seen["judge"] == judge_config(s, log_dir=str(model.parent))
    assert json.loads(open(evaluation_path(str(model))).read())["judge"] == verdicts
