"""The LLM-judge prompt template: only plain `{question}`, `{golds}`, `{prediction}` fields; attribute or
index access, conversions and format specs are refused at validation (a 422, never a 500 or a
gigabyte allocation), and rendering is a concatenation that keeps braces in the values as they are."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from searchr1.reward.params import render_template, template_parts
from searchr1.reward.registry import JudgeParams


@pytest.mark.parametrize("prompt", ["{question.x}", "{question[0]}", "{question:>9999999999}", "{question!r}",
                                    "{other}", "{0}", "{}", "{question", "}"])
def test_unsafe_templates_are_refused(prompt):
    with pytest.raises(ValidationError):
        JudgeParams(prompt=prompt)


def test_plain_fields_render_by_concatenation():
    p = JudgeParams(prompt="Q: {question} | G: {golds} | P: {prediction} {{literal}}")
    out = render_template(p.prompt, {"question": "{prediction.x}", "golds": "a; b", "prediction": "{0:>99}"})
    assert out == "Q: {prediction.x} | G: a; b | P: {0:>99} {literal}"
    assert template_parts("x{question}y") == [("x", "question"), ("y", None)]
