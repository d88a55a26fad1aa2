"""Registry, params precedence, composite reward, item shapes and settings (in process, no server)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from searchr1.core.clients.reward import ScoreItem, ScoreRequest
from searchr1.core.protocol import make_prompt, observation_for
from searchr1.core.settings import load_settings
from searchr1.reward.registry import Registry, ScorerInputError, ScoringContext
from searchr1.reward.runner import run_scorer
from searchr1.reward.scorers import SCORERS, default_registry, question_of
from searchr1.reward.settings import RewardSettings

INLINE = RewardSettings().inline_max_items
PROMPT = f"<|im_start|>user\n{make_prompt('capital of france')}<|im_end|>\n<|im_start|>assistant\n"
OBS = observation_for(["Paris\nParis is the capital of France."])
GOOD = "<think>a</think><search>capital</search>" + OBS + "<think>b</think><answer> Paris </answer>"
ITEM = ScoreItem(prompt=PROMPT, response=GOOD, golden_answers=["Paris"])


def ctx(**defaults) -> ScoringContext:
    return ScoringContext(registry=default_registry(), defaults=defaults, inline_max_items=INLINE)


def test_registry_lists_every_scorer_with_params_schema():
    reg = default_registry()
    names = reg.names()
    for required in ("searchr1_em", "searchr1_subem", "searchr1_em_format", "exact_match", "substring_match",
                     "f1", "format", "retrieval_hit", "search_cost", "embedding_similarity", "llm_judge",
                     "composite"):
        assert required in names
    described = {d["name"]: d for d in reg.describe()}
    fmt = described["searchr1_em_format"]["params"]["properties"]
    assert set(fmt) == {"structure_format_score", "final_format_score", "retrieval_score", "format_score", "score"}
    assert described["searchr1_em"]["input"] == "any" and described["exact_match"]["input"] == "response"
    with pytest.raises(ValueError, match="twice"):
        Registry([SCORERS[0], SCORERS[0]])
    with pytest.raises(ScorerInputError, match="unknown scorer 'nope'"):
        reg.get("nope")


async def test_searchr1_scorers_accept_both_shapes_identically():
    c = ctx()
    solution = ScoreItem(solution_str=PROMPT + GOOD, ground_truth={"target": ["Paris"]})
    for name in ("searchr1_em", "searchr1_subem", "searchr1_em_format"):
        a = await run_scorer(c, name, [solution])
        b = await run_scorer(c, name, [ITEM])
        assert a == b
        assert a[0][0] == 1.0
    [(value, parts)] = await run_scorer(c, "searchr1_em_format", [ScoreItem(
        solution_str=PROMPT + GOOD + "<|im_end|>", ground_truth={"target": ["Paris"]})],
        {"structure_format_score": 0.2})
    assert value == pytest.approx(0.8)
    assert parts == {"searchr1_em_format": pytest.approx(0.8), "valid_format": 0.0, "retrieval_correct": 0.0,
                     "has_answer": 1.0, "answer_correct": 1.0}


async def test_params_precedence_request_over_config_over_defaults():
    wrong = ScoreItem(solution_str=PROMPT + "<answer>Lyon</answer>", ground_truth={"target": ["Paris"]})
    assert (await run_scorer(ctx(), "searchr1_em", [wrong]))[0][0] == 0.0
    configured = ctx(searchr1_em={"format_score": 0.1})
    assert (await run_scorer(configured, "searchr1_em", [wrong]))[0][0] == pytest.approx(0.1)
    assert (await run_scorer(configured, "searchr1_em", [wrong], {"format_score": 0.3}))[0][0] == pytest.approx(0.3)
    with pytest.raises(ScorerInputError, match="format_score"):
        await run_scorer(configured, "searchr1_em", [wrong], {"format_score": "lots"})
    with pytest.raises(ScorerInputError, match="Extra inputs"):
        await run_scorer(configured, "searchr1_em", [wrong], {"fromat_score": 0.3})


async def test_response_scorers_refuse_solution_items():
    solution = ScoreItem(solution_str=PROMPT + GOOD, ground_truth={"target": ["Paris"]})
    with pytest.raises(ScorerInputError, match="response alone"):
        await run_scorer(ctx(), "exact_match", [ITEM, solution])


async def test_composite_weights_and_breakdown():
    params = {"components": [
        {"scorer": "exact_match", "weight": 1.0},
        {"scorer": "format", "weight": 0.2},
        {"scorer": "search_cost", "weight": 1.0, "params": {"cost_per_search": 0.05}},
        {"scorer": "searchr1_em_format", "weight": 0.5, "name": "s1", "params": {"structure_format_score": 0.2}},
    ]}
    [(value, parts)] = await run_scorer(ctx(), "composite", [ITEM], params)
    # 1*1 + 0.2*1 + 1*(-0.05 for one counted search) + 0.5*1 = 1.65
    assert value == pytest.approx(1.65)
    assert parts == {"exact_match": 1.0, "format": 1.0, "search_cost": pytest.approx(-0.05), "s1": 1.0,
                     # the components' own facts, under "<name>.<fact>"
                     "s1.valid_format": 1.0, "s1.retrieval_correct": 1.0, "s1.has_answer": 1.0,
                     "s1.answer_correct": 1.0}
    # num_searches from the item wins over counting tags
    item3 = ScoreItem(prompt=PROMPT, response=GOOD, golden_answers=["Paris"], num_searches=3)
    [(value3, parts3)] = await run_scorer(ctx(), "composite", [item3], params)
    assert parts3["search_cost"] == pytest.approx(-0.15) and value3 == pytest.approx(1.55)


async def test_search_cost_charged_only_on_correct_answers():
    """`charge = "if_correct"`: a wrong answer keeps its searches free, so searching never scores below a
    wrong guess (with `always`, a wrong two-search answer scores 0.2 below one that guessed)."""
    wrong = ScoreItem(prompt=PROMPT, response=GOOD.replace("Paris </answer>", "Lyon </answer>"),
                      golden_answers=["Paris"], num_searches=2)
    right = ScoreItem(prompt=PROMPT, response=GOOD, golden_answers=["Paris"], num_searches=2)
    no_answer = ScoreItem(prompt=PROMPT, response="<think>a</think><search>capital</search>",
                          golden_answers=["Paris"], num_searches=1)
    items = [wrong, right, no_answer]
    always = await run_scorer(ctx(), "search_cost", items, {"cost_per_search": 0.1})
    gated = await run_scorer(ctx(), "search_cost", items, {"cost_per_search": 0.1, "charge": "if_correct"})
    assert [v for v, _ in always] == pytest.approx([-0.2, -0.2, -0.1])
    assert [v for v, _ in gated] == pytest.approx([0.0, -0.2, 0.0])
    assert gated[1][1] == {"search_cost": pytest.approx(-0.2)}
    with pytest.raises(ScorerInputError, match="charge"):
        await run_scorer(ctx(), "search_cost", items, {"charge": "sometimes"})


async def test_composite_from_config_and_its_errors():
    c = ctx(composite={"components": [{"scorer": "f1"}, {"scorer": "retrieval_hit", "weight": 0.1}]})
    item = ScoreItem(prompt=PROMPT, response=GOOD.replace("Paris </answer>", "Paris France </answer>"),
                     golden_answers=["Paris"])
    [(value, parts)] = await run_scorer(c, "composite", [item])
    assert value == pytest.approx(2 / 3 + 0.1) and parts == {"f1": pytest.approx(2 / 3), "retrieval_hit": 1.0}
    for bad, msg in [
        ({"components": [{"scorer": "composite"}]}, "cannot itself be composite"),
        ({"components": [{"scorer": "nope"}]}, "unknown scorer"),
        ({"components": [{"scorer": "search_cost", "params": {"cost_per_search": -1}}]}, "cost_per_search"),
        ({"components": [{"scorer": "f1"}, {"scorer": "f1"}]}, "unique"),
        ({"components": []}, "at least 1"),
    ]:
        with pytest.raises(ScorerInputError, match=msg):
            await run_scorer(c, "composite", [item], bad)


async def test_unavailable_resources_are_input_errors():
    with pytest.raises(ScorerInputError, match="no judge endpoint"):
        await run_scorer(ctx(), "llm_judge", [ITEM])
    with pytest.raises(ScorerInputError, match="no encoder"):
        await run_scorer(ctx(), "embedding_similarity", [ITEM])


async def test_embedding_scorer_with_a_fake_encoder_batches_one_encode():
    calls = []

    class Fake:
        def encode(self, texts):
            calls.append(list(texts))
            return [[1.0, 0.0] if t.lower().startswith("paris") else [0.6, 0.8] for t in texts]

    c = ScoringContext(registry=default_registry(), encoder=lambda model: Fake(), inline_max_items=INLINE)
    items = [ITEM, ScoreItem(prompt=PROMPT, response="<answer>Lyon</answer>", golden_answers=["Paris"]),
             ScoreItem(prompt=PROMPT, response="no answer", golden_answers=["Paris"])]
    results = await run_scorer(c, "embedding_similarity", items)
    assert [v for v, _ in results] == [pytest.approx(1.0), pytest.approx(0.6), 0.0]
    assert calls == [["Paris", "Paris", "Lyon", "Paris"]]


def test_score_item_shapes():
    ScoreItem(solution_str="x", ground_truth={"target": ["a"]})
    ScoreItem(prompt="p", response="r", golden_answers=[], num_searches=0)
    for bad in [{"solution_str": "x"}, {"prompt": "p", "response": "r"},
                {"solution_str": "x", "ground_truth": {"target": ["a"]}, "response": "r"},
                {"prompt": "p", "response": "r", "golden_answers": ["a"], "num_searches": -1},
                {"prompt": "p", "response": "r", "golden_answers": ["a"], "extra": 1},
                {"solution_str": "x", "ground_truth": {"target": ["a"], "other": 1}}, {}]:
        with pytest.raises(ValidationError):
            ScoreItem.model_validate(bad)
    with pytest.raises(ValidationError):
        ScoreRequest(scorer="bad name!", items=[])
    assert ScoreItem(prompt="p ", response="r", golden_answers=["a"]).full_text == "p r"


def test_question_of_prompt():
    assert question_of(PROMPT) == "capital of france?"
    assert question_of("plain") == "plain"


def test_settings_from_env_and_config(tmp_path, monkeypatch):
    cfg = tmp_path / "run.toml"
    cfg.write_text('[reward]\nport = 9001\nmax_batch_items = 64\n[reward.judge]\nmodel = "m"\n'
                   '[reward.scorer_params.composite]\ncomponents = [{scorer = "exact_match", weight = 2.0}]\n')
    monkeypatch.setenv("REWARD_JUDGE__URL", "http://127.0.0.1:1")
    monkeypatch.setenv("REWARD_PORT", "9002")
    st = load_settings(RewardSettings, cfg)
    assert st.port == 9002 and st.max_batch_items == 64 and st.judge.model == "m"
    assert st.judge.url == "http://127.0.0.1:1"
    assert st.scorer_params["composite"]["components"][0]["weight"] == 2.0
    with pytest.raises(ValidationError):
        RewardSettings(max_batch_items=0)
    with pytest.raises(ValidationError):
        RewardSettings(bogus=1)
