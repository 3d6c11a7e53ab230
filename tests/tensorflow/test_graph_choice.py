"""Caramel's graph of several steps against the backend's own graph of one step
(`caramel.tensorflow.graph_choice`): blocks of each in turn, then the one that measured faster,
Caramel's only by more than MIN_GAIN. Driven here with given step times, on one rank (the choice
is broadcast from rank 0)."""

from __future__ import annotations

import pytest

from caramel.planner.rounds import BLOCK_PAIRS
from caramel.tensorflow.graph_choice import CARAMEL, OWN_GRAPH, GraphChoice
from caramel.tensorflow.selector import MIN_GAIN

BLOCK = 4  # steps per block: one execution of 4 steps
ROUND = 2 * BLOCK_PAIRS * BLOCK


def run_round(choice: GraphChoice, step_seconds: dict[str, float]) -> tuple[list[str], str | None]:
    """Runs executions of BLOCK steps, each of the graph the choice says, until the round ends;
    returns the graphs run and the round's outcome."""
    graphs, outcome = [], None
    while outcome is None and len(graphs) < ROUND:
        graph = choice.next_graph()
        graphs.append(graph)
        outcome = choice.ran(graph, BLOCK, BLOCK, BLOCK * step_seconds[graph])
    return graphs, outcome


def test_blocks_of_each_graph_run_in_turn_the_own_graphs_first(one_rank):
    choice = GraphChoice(BLOCK, one_rank)
    choice.start_round()
    graphs, outcome = run_round(choice, {CARAMEL: 0.1, OWN_GRAPH: 0.2})
    assert graphs == [OWN_GRAPH, CARAMEL] * BLOCK_PAIRS
    assert outcome is not None and not choice.measuring
    assert choice.means == pytest.approx({CARAMEL: 0.1, OWN_GRAPH: 0.2})


def test_caramels_graph_is_kept_only_if_it_measured_clearly_faster(one_rank):
    clearly = GraphChoice(BLOCK, one_rank)
    clearly.start_round()
    run_round(clearly, {CARAMEL: 0.1 * (1 - 2 * MIN_GAIN), OWN_GRAPH: 0.1})
    assert clearly.chosen == CARAMEL and clearly.next_graph() == CARAMEL

    barely = GraphChoice(BLOCK, one_rank)
    barely.start_round()
    _, outcome = run_round(barely, {CARAMEL: 0.1 * (1 - MIN_GAIN / 2), OWN_GRAPH: 0.1})
    assert barely.chosen == OWN_GRAPH and barely.next_graph() == OWN_GRAPH
    assert "TensorFlow's collectives in buckets as the gradients come in a graph of one step" in outcome


def test_steps_that_built_a_graph_are_not_counted(one_rank):
    choice = GraphChoice(BLOCK, one_rank)
    choice.start_round()
    # Horovod's first block builds its graph: three of its four steps timed, the first slow
    # step left out; Caramel's graph measured slower per timed step.
    choice.ran(OWN_GRAPH, BLOCK, BLOCK - 1, (BLOCK - 1) * 0.1)
    for graph in [CARAMEL, OWN_GRAPH, CARAMEL][: 2 * BLOCK_PAIRS - 1]:
        choice.ran(graph, BLOCK, BLOCK, BLOCK * (0.12 if graph == CARAMEL else 0.1))
    assert choice.means == pytest.approx({CARAMEL: 0.12, OWN_GRAPH: 0.1})
    assert choice.chosen == OWN_GRAPH


def test_the_own_graph_once_chosen_runs_its_spell_then_caramels_is_tried_again(one_rank):
    choice = GraphChoice(BLOCK, one_rank, exploit_steps=3 * BLOCK)
    choice.start_round()
    run_round(choice, {CARAMEL: 0.2, OWN_GRAPH: 0.1})
    spell = []
    for _ in range(3):
        spell.append(choice.next_graph())
        assert choice.ran(spell[-1], BLOCK, BLOCK, BLOCK * 0.1) is None
    assert spell == [OWN_GRAPH] * 3
    assert choice.next_graph() == CARAMEL  # the step function then starts the selector's round anew


def test_no_round_without_a_start(one_rank):
    choice = GraphChoice(BLOCK, one_rank)
    assert not choice.measuring and choice.next_graph() == CARAMEL
    assert choice.ran(CARAMEL, BLOCK, BLOCK, 1.0) is None and choice.chosen == CARAMEL
