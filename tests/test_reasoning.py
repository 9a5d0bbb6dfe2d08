"""Test-time compute (utils/eval/reasoning.py): the default is the references' evaluation bitwise; more segments,
early exit on the Q head, seeded rollouts ranked by q_halt, and dihedral views voted as TRM's ARC evaluator votes."""

import argparse
from types import SimpleNamespace

import pytest
import torch

from models import build_model, validate_arch
from utils.data.common import dihedral, inverse_dihedral
from utils.eval.flags import add_test_time_arguments
from utils.eval.reasoning import TestTimeCompute, TestTimeComputeError, reason, vote
from utils.eval.reasoning import test_time_compute as from_flags  # a test_* name pytest would collect

SEQ, VOCAB, BATCH = 16, 6, 5  # a 4 x 4 grid


@pytest.fixture(scope="module", params=["hrm_v1", "trm"])
def head(request):
    torch.manual_seed(0)
    extra = {"puzzle_emb_len": 0} if request.param == "trm" else {}
    arch = validate_arch({"name": request.param, **extra, "hidden_size": 32, "num_heads": 2, "H_layers": 1, "L_layers": 1,
                          "H_cycles": 2, "L_cycles": 2, "expansion": 2, "halt_max_steps": 4, "puzzle_emb_ndim": 0,
                          "halt_exploration_prob": 0.1, "pos_encodings": "rope"})
    head = build_model(arch, batch_size=BATCH, seq_len=SEQ, vocab_size=VOCAB, num_puzzle_identifiers=1,
                       dtype=torch.float32, device="cpu")
    with torch.no_grad():  # an untrained Q head is constant (weight 0, bias -5): give it an opinion
        head.model.inner.q_head.weight.normal_(0, 0.5)
        head.model.inner.q_head.bias.zero_()
    return head.eval()


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(1)
    inputs = torch.randint(1, VOCAB, (BATCH, SEQ), generator=g)
    return {"inputs": inputs, "labels": torch.randint(1, VOCAB, (BATCH, SEQ), generator=g),
            "puzzle_identifiers": torch.zeros(BATCH, dtype=torch.int32)}


def references_evaluation(head, batch):
    """The references' loop: call the ACT loss head from the initial carry until every row halted."""
    with torch.no_grad():
        carry = head.initial_carry(batch)
        while True:
            carry, _, _, outputs, all_halted = head(carry, batch)
            if all_halted:
                return outputs, carry.steps


def test_the_default_is_the_references_evaluation_bitwise(head, batch):
    outputs, steps = references_evaluation(head, batch)
    answer = reason(head, head, batch, TestTimeCompute())
    assert torch.equal(answer["logits"], outputs["logits"]) and torch.equal(answer["q_halt_logits"], outputs["q_halt_logits"])
    assert (answer["segments"] == steps).all() and (answer["segments"] == 4).all()


def test_more_segments_than_training_and_every_segment_kept(head, batch):
    answer = reason(head, head, batch, TestTimeCompute(segments=7, keep_segments=True))
    assert (answer["segments"] == 7).all()
    assert answer["segment_preds"].shape == (BATCH, 7, SEQ) and answer["segment_q_halt"].shape == (BATCH, 7)
    assert torch.equal(answer["segment_preds"][:, -1], answer["preds"])
    four = reason(head, head, batch, TestTimeCompute(segments=4))
    assert torch.equal(answer["segment_preds"][:, 3], four["preds"])  # the first four segments are the default's


def test_early_exit_stops_a_row_where_the_q_head_says_halt(head, batch):
    with torch.no_grad():
        bias = head.model.inner.q_head.bias
        saved = bias.clone()
        bias[0] = 100.0  # every row is confident at once
    try:
        answer = reason(head, head, batch, TestTimeCompute(segments=8, early_exit=True, min_segments=2,
                                                           keep_segments=True))
        assert (answer["segments"] == 2).all()
        assert torch.equal(answer["segment_preds"][:, 1], answer["segment_preds"][:, -1])  # held after stopping
    finally:
        with torch.no_grad():
            bias.copy_(saved)


def test_rollouts_keep_the_most_confident_answer_and_are_seeded(head, batch):
    one = reason(head, head, batch, TestTimeCompute())
    many = reason(head, head, batch, TestTimeCompute(rollouts=4, noise=1.0, seed=3))
    assert (many["q_halt_logits"] >= one["q_halt_logits"]).all()  # rollout 0 is the plain answer, so never worse
    again = reason(head, head, batch, TestTimeCompute(rollouts=4, noise=1.0, seed=3))
    assert torch.equal(many["logits"], again["logits"])
    other = reason(head, head, batch, TestTimeCompute(rollouts=2, noise=1.0, seed=4))
    assert not torch.equal(other["q_halt_logits"], reason(head, head, batch, TestTimeCompute(rollouts=2, noise=1.0,
                                                                                             seed=5))["q_halt_logits"])


def test_views_answer_every_rotation_and_keep_the_answer_most_views_agree_on(head, batch):
    # An independent re-computation: transform each grid with the dataset builders' numpy dihedral, answer it as a
    # plain batch, map the answer back, and rank the distinct answers by votes, then mean sigmoid(q_halt).
    grids = batch["inputs"].numpy().reshape(BATCH, 4, 4)
    answers, confidences = [], []
    for t in range(8):
        view = dict(batch, inputs=torch.from_numpy(dihedral(grids, t).reshape(BATCH, SEQ).copy()))
        one = reason(head, head, view, TestTimeCompute())
        answers.append(inverse_dihedral(one["preds"].numpy().reshape(BATCH, 4, 4), t).reshape(BATCH, SEQ))
        confidences.append(torch.sigmoid(one["q_halt_logits"]).numpy())
    voted = reason(head, head, batch, TestTimeCompute(views=8))
    assert torch.equal(reason(head, head, batch, TestTimeCompute(views=1))["logits"],
                       reason(head, head, batch, TestTimeCompute())["logits"])
    for row in range(BATCH):
        pool = {}
        for t in range(8):
            count, total = pool.get(answers[t][row].tobytes(), (0, 0.0))
            pool[answers[t][row].tobytes()] = (count + 1, total + float(confidences[t][row]))
        best = max(pool, key=lambda key: (pool[key][0], pool[key][1] / pool[key][0]))
        assert voted["preds"][row].numpy().tobytes() == best and int(voted["votes"][row]) == pool[best][0]
        assert torch.equal(voted["logits"][row].argmax(-1), voted["preds"][row])  # logits mapped back with the answer


def test_vote_counts_identical_answers_before_confidence():
    def answer(preds, q):
        return {"preds": torch.tensor(preds), "q_halt_logits": torch.tensor(q), "segments": torch.tensor([1, 2])}
    views = [answer([[1, 2], [5, 5]], [9.0, -1.0]),  # row 0: alone and confident; row 1: tied, less confident
             answer([[3, 4], [6, 6]], [-2.0, 3.0]),
             answer([[3, 4], [5, 5]], [-3.0, -2.0])]
    kept = vote(views)
    assert kept["preds"].tolist() == [[3, 4], [5, 5]]  # two votes beat one confident view
    assert kept["q_halt_logits"].tolist() == [-2.0, -1.0] and kept["segments"].tolist() == [1, 2]  # the first agreeing view
    assert kept["votes"].tolist() == [2, 2]
    tie = vote([answer([[1, 2], [5, 5]], [0.0, 0.0]), answer([[3, 4], [6, 6]], [1.0, -1.0])])
    assert tie["preds"].tolist() == [[3, 4], [5, 5]]  # one vote each: the higher confidence, then the earlier view


def test_views_refuse_grids_they_cannot_rotate(head, batch):
    with pytest.raises(TestTimeComputeError, match="15 cells"):
        reason(head, head, {k: v[:, :15] if v.ndim == 2 else v for k, v in batch.items()}, TestTimeCompute(views=2))
    with pytest.raises(TestTimeComputeError, match="identifiers"):
        reason(head, head, dict(batch, puzzle_identifiers=torch.arange(BATCH, dtype=torch.int32)), TestTimeCompute(views=2))


@pytest.mark.parametrize("settings,fragment", [
    (dict(views=0), "views=0"), (dict(views=9), "views=9"), (dict(segments=0), "segments=0"), (dict(rollouts=0), "rollouts=0"), (dict(rollouts=3), "noise=0.0"),
    (dict(noise=float("nan")), "noise=nan"), (dict(segments=2, min_segments=3), "min_segments=3"),
])
def test_bad_settings_are_named(settings, fragment):
    with pytest.raises(TestTimeComputeError, match=fragment):
        TestTimeCompute(**settings).check()


def test_without_flags_a_run_is_scored_with_its_own_evaluation_settings():
    parser = argparse.ArgumentParser()
    add_test_time_arguments(parser)
    run = SimpleNamespace(eval_halt_max_steps=4, eval_early_exit=False, eval_min_segments=1, eval_rollouts=16,
                          eval_noise=0.5, seed=7)
    # the run's rollouts are seeded by its seed, as pretrain.py's evaluations are; --rollout-seed may change it
    assert from_flags(parser.parse_args([]), run) == TestTimeCompute(4, rollouts=16, noise=0.5, seed=7)
    reseeded = from_flags(parser.parse_args(["--rollout-seed", "3"]), run)
    assert reseeded == TestTimeCompute(4, rollouts=16, noise=0.5, seed=3)
    # any flag replaces all of the run's settings; the others take the references' defaults
    assert from_flags(parser.parse_args(["--segments", "8"]), run) == TestTimeCompute(8)
    assert from_flags(parser.parse_args(["--rollouts", "4"]), run) == TestTimeCompute(rollouts=4, noise=1.0)
    assert from_flags(parser.parse_args(["--early-exit"]), run) == TestTimeCompute(early_exit=True)
    assert from_flags(parser.parse_args(["--views", "8"]), run) == TestTimeCompute(views=8)
    voting = SimpleNamespace(**vars(run), eval_views=8)
    assert from_flags(parser.parse_args([]), voting) == TestTimeCompute(4, rollouts=16, noise=0.5, seed=7, views=8)
    # no run at hand (or a reference checkpoint's defaults): the references' evaluation
    assert from_flags(parser.parse_args([])).plain
    with pytest.raises(TestTimeComputeError, match="--min-segments=0 is out of range"):  # as the user typed it
        from_flags(parser.parse_args(["--min-segments", "0"]), run)


def test_newcomer_checked_selection_keeps_only_a_shortest_maze_path():
    """device=cpu: checked selection (and so solve.py, the page and evaluate.py --checked, which share RULES) calls a
    maze answer with a dead end or both branches of a loop wrong, and the one shortest path right."""
    import numpy as np

    from utils.data.user_puzzles import maze_problems, parse_maze
    from utils.eval.reasoning import RULES, rules_checker

    maze, shape = parse_maze("#####\n#S  #\n# # #\n#  G#\n#####\n", "loop")  # two shortest paths of 4 moves
    answers = np.repeat(maze.reshape(1, *shape), 3, axis=0)
    answers[:, 1, 2] = answers[:, 1, 3] = answers[:, 2, 3] = 5  # S > right > right > down > G
    answers[1, 2, 1] = 5  # a dead end below S
    answers[2, 2, 1] = answers[2, 3, 1] = answers[2, 3, 2] = 5  # and the other way round as well
    inputs = torch.from_numpy(np.stack([maze] * 3))
    assert RULES["maze"] is maze_problems
    assert rules_checker("maze")(inputs, torch.from_numpy(answers.reshape(3, -1))).tolist() == [True, False, False]
