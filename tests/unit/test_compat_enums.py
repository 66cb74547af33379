"""The node path's enums (rsc_health.compat.StrEnum / IntEnum, what model's vocabularies are made
of) behave as the standard library's StrEnum and IntEnum do for every use the product makes of
them: each model class side by side with an enum class of the same members."""

from __future__ import annotations

import copy
import enum
import json
import pickle
import subprocess
import sys

import pytest

from rsc_health import compat, model

VOCABULARIES = [model.Status, model.Level, model.ActionKind, model.SuspectState, model.Metric]


def twin(ours):
    """The standard library's enum with the same members, aliases included, in order."""
    base = enum.IntEnum if issubclass(ours, int) else enum.StrEnum
    return base(ours.__name__, [(name, m.value) for name, m in ours.__members__.items()])


def said(action):
    try:
        return ("ok", action())
    except Exception as exc:  # noqa: BLE001 - the exception is what is compared
        return (type(exc).__name__, str(exc))


@pytest.mark.parametrize("ours", VOCABULARIES, ids=lambda c: c.__name__)
def test_the_vocabularies_iterate_look_up_and_print_as_enum_does(ours):
    theirs = twin(ours)
    assert [m.name for m in ours] == [m.name for m in theirs]
    assert [m.value for m in ours] == [m.value for m in theirs]
    assert [type(m.value) for m in ours] == [type(m.value) for m in theirs]
    assert [m.name for m in reversed(ours)] == [m.name for m in reversed(theirs)]
    assert len(ours) == len(theirs)
    assert {k: v.name for k, v in ours.__members__.items()} == \
        {k: v.name for k, v in theirs.__members__.items()}
    assert repr(ours) == repr(theirs)
    for mine, std in zip(ours, theirs, strict=True):
        assert type(mine) is ours and isinstance(mine, type(std.value))
        assert repr(mine) == repr(std)
        assert str(mine) == str(std) and f"{mine}" == f"{std}"
        assert f"{mine:>20}|{mine!s}|{mine!r}" == f"{std:>20}|{std!s}|{std!r}"
        assert "%s %r" % (mine, mine) == "%s %r" % (std, std)  # noqa: UP031 - %-format too
        assert hash(mine) == hash(std) == hash(std.value) and mine == std.value
        assert ours(std.value) is mine and ours[std.name] is mine and ours(mine) is mine
        assert getattr(ours, std.name) is mine
        assert json.dumps({mine: [mine]}) == json.dumps({std: [std]})
        assert pickle.loads(pickle.dumps(mine)) is mine
        assert copy.copy(mine) is mine and copy.deepcopy({"m": mine})["m"] is mine
        assert mine in ours and std.value in ours
    assert said(lambda: ours("no such value")) == said(lambda: theirs("no such value"))
    assert said(lambda: ours[")"]) == said(lambda: theirs[")"])
    assert said(lambda: ours(["unhashable"]))[0] == "ValueError"
    assert "no such value" not in ours


def test_level_keeps_its_aliases_order_and_arithmetic():
    level = model.Level
    assert level.NONE is level.OK and level.UNKNOWN is level.CHECKER_ERROR
    assert level.NONE.name == "OK" and level["UNKNOWN"] is level.CHECKER_ERROR
    assert level(2) is level.CHECKER_ERROR and level(True) is level.WARN
    assert sorted([level.DRAIN_NOW, level.OK, level.WARN]) == [0, 1, 4]
    assert max([level.WARN, level.DRAIN_AFTER_JOB, level.CHECKER_ERROR]) is level.DRAIN_AFTER_JOB
    assert not level.OK and level.WARN + 1 == 2 and type(level.WARN + 1) is int
    assert [lv.label for lv in level] == ["ok", "warn", "checker_error", "drain_after_job",
                                          "drain_now"]
    assert level.from_exit_code(4) is level.CHECKER_ERROR
    assert model.Severity.parse(" Drain-Now ") is level.DRAIN_NOW
    with pytest.raises(ValueError, match="7 is not a valid Level"):
        level(7)


def test_the_vocabularies_are_strs_that_sql_and_files_take_as_their_value():
    assert model.Status.FAIL.upper() == "FAIL" and type(model.Status.FAIL.upper()) is str
    assert model.Metric.GPU_TEMP_C + "_c" == "gpu_temp_c_c"
    assert {"fail": 1}[model.Status.FAIL] == 1 and model.Status.FAIL in {"fail"}
    assert compat.json_dumps({model.ActionKind.RESUME: model.Level.WARN}) == '{"resume": 1}'
    finding = model.Finding("xid", "gpu3", model.Status.FAIL, model.Level.DRAIN_NOW, "Xid 79")
    assert model.Finding.from_dict(json.loads(json.dumps(finding.to_dict()))) == finding


def test_the_vocabularies_cannot_be_changed_or_extended():
    with pytest.raises(AttributeError, match="cannot reassign member 'OK'"):
        model.Status.OK = "fine"
    with pytest.raises(AttributeError, match="cannot delete member 'OK'"):
        del model.Status.OK
    with pytest.raises(TypeError, match="cannot extend"):
        type("More", (model.Status,), {"MORE": "more"})
    assert model.Status.OK == "ok" and model.Status("ok") is model.Status.OK


def test_a_new_vocabulary_takes_aliases_and_refuses_the_wrong_data_type():
    class Word(compat.StrEnum):
        ONE = "one"
        UNO = "one"
        TWO = "two"

        @property
        def loud(self) -> str:
            return self.upper()

    assert list(Word) == [Word.ONE, Word.TWO] and Word.UNO is Word.ONE and Word.TWO.loud == "TWO"
    assert list(Word.__members__) == ["ONE", "UNO", "TWO"]
    with pytest.raises(TypeError):
        type("Bad", (compat.IntEnum,), {"X": "x"})


def test_the_model_imports_no_enum():
    code = "import sys, rsc_health.model; print('enum' in sys.modules)"
    out = subprocess.run([sys.executable, "-S", "-c", code], check=True, capture_output=True,
                         text=True, env={"PYTHONPATH": str(__import__("pathlib").Path(
                             compat.__file__).parents[1])}).stdout
    assert out.strip() == "False"
