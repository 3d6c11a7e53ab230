"""The env contract: what every worker and training process is told, in both run modes."""

from __future__ import annotations

import pytest
from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

from caramel.allreduce.simulate import choose_allreduce
from caramel.contract.api import MemoryAllocator
from caramel.contract.env import RENDEZVOUS_TIMEOUT_SECONDS, WorkerContract, slot_env, worker_command, worker_env, worker_name
from caramel.contract.jobfile import parse_job
from caramel.contract.ports import PortMap
from caramel.contract.restart import SCRIPT_ERROR_WAIT_SECONDS, RestartPolicy
from caramel.contract.termination import ScriptRaised
from caramel.launch.rendezvous import Host, Round
from caramel.network.synthetic import racks, torus
from caramel.network.wire import from_wire, job_topology, to_wire
from caramel.planner.policy import Batching, Collective, Ordering, PlanningPolicy
from testbed.lab import LAB_SCHEDULING, lab_policy, lab_variables


def job(replicas=3, slots=2, min_replicas=None, **spec):
    workers = {"replicas": replicas, "slotsPerWorker": slots} | ({"minReplicas": min_replicas} if min_replicas else {})
    return parse_job(
        {
            "apiVersion": "caramel.dev/v1alpha1",
            "kind": "CaramelJob",
            "metadata": {"name": "demo"},
            "spec": {"script": "train.py", "args": ["--steps", "3"], "workers": workers, **spec},
        }
    )


CLUSTER_PEERS = [f"demo-worker-{i}.demo.default.svc" for i in range(3)]


def process_envs(the_job, peers, topology=None):
    for index in range(len(peers)):
        worker = worker_env(the_job, index, peers, topology=topology)
        for slot in range(the_job.spec.workers.slots):
            yield {**worker, **slot_env(worker, slot)}


def test_ranks_match_horovods_own_host_assignment():
    the_job = job()
    envs = list(process_envs(the_job, CLUSTER_PEERS))
    hosts = envs[0]["CARAMEL_HOSTS"]
    assert hosts == "demo-worker-0:2,demo-worker-1:2,demo-worker-2:2"
    for slot_info, env in zip(get_host_assignments(parse_hosts(hosts), the_job.world_size), envs):
        assert env["HOROVOD_HOSTNAME"] == slot_info.hostname
        assert int(env["HOROVOD_RANK"]) == slot_info.rank
        assert int(env["HOROVOD_SIZE"]) == slot_info.size
        assert int(env["HOROVOD_LOCAL_RANK"]) == slot_info.local_rank
        assert int(env["HOROVOD_LOCAL_SIZE"]) == slot_info.local_size
        assert int(env["HOROVOD_CROSS_RANK"]) == slot_info.cross_rank
        assert int(env["HOROVOD_CROSS_SIZE"]) == slot_info.cross_size


def test_rendezvous_is_worker_zero_on_the_spec_port():
    env = worker_env(job(rendezvous={"port": 31000, "networkInterface": "eth0"}), 2, CLUSTER_PEERS)
    assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == CLUSTER_PEERS[0]
    assert env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "31000"
    assert env["HOROVOD_GLOO_IFACE"] == "eth0"
    assert env["HOROVOD_CONTROLLER"] == env["HOROVOD_CPU_OPERATIONS"] == "gloo"


def test_metrics_ports_are_unique_per_machine():
    the_job = job(metrics={"port": 9000})
    cluster_ports = [env["CARAMEL_METRICS_PORT"] for env in process_envs(the_job, CLUSTER_PEERS)]
    assert cluster_ports == ["9000", "9001"] * 3  # every pod is its own machine
    local_ports = [env["CARAMEL_METRICS_PORT"] for env in process_envs(the_job, ["127.0.0.1"] * 3)]
    assert local_ports == [str(9000 + rank) for rank in range(6)]


def test_metrics_disabled_gives_no_port():
    env = worker_env(job(metrics={"enabled": False}), 0, CLUSTER_PEERS)
    assert env["CARAMEL_METRICS_PORT"] == ""
    assert "CARAMEL_METRICS_PORT" not in slot_env(env, 1)


def test_contract_round_trips_scheduling_and_checkpoint():
    the_job = job(caramel={"allreduce": "ring", "minBucketBytes": 512, "maxBucketBytes": 1024}, checkpoint={"path": "/ckpt", "intervalSteps": 5})
    worker = worker_env(the_job, 1, CLUSTER_PEERS)
    contract = WorkerContract.from_env({**worker, **slot_env(worker, 1)})
    assert contract.scheduling == the_job.spec.caramel
    assert contract.checkpoint == the_job.spec.checkpoint
    assert contract.rank == 3
    assert contract.worker_index == 1
    assert contract.slots_per_worker == 2
    assert contract.rendezvous_addr == CLUSTER_PEERS[0]


def test_lab_settings_reach_the_worker_through_the_jobs_environment_and_a_bad_one_is_named():
    default = lab_policy(worker_env(job(), 0, CLUSTER_PEERS))
    assert default == PlanningPolicy(Ordering.TIC, Batching.AUTO, Collective.ALLREDUCE, first_plan_waits=False)
    variables = lab_variables(ordering="arrival", batching="off", collective="split")
    worker = worker_env(job(env=[{"name": name, "value": value} for name, value in variables.items()]), 0, CLUSTER_PEERS)
    assert lab_policy(worker) == PlanningPolicy(ordering=Ordering.ARRIVAL, batching=Batching.OFF, collective=Collective.SPLIT)
    with pytest.raises(RuntimeError, match="CARAMEL_LAB_SCHEDULING: batching: Input should be 'auto', 'fixed' or 'off'"):
        lab_policy({**worker, "CARAMEL_LAB_SCHEDULING": '{"batching": "sometimes"}'})
    with pytest.raises(RuntimeError, match="CARAMEL_LAB_SCHEDULING: order: not a setting"):
        lab_variables(order="arrival")
    with pytest.raises(RuntimeError, match="CARAMEL_LAB_SCHEDULING: not JSON"):
        lab_policy({LAB_SCHEDULING: "ordering=arrival"})


def test_the_memory_allocator_reaches_the_worker_and_a_bad_one_is_named():
    default = WorkerContract.from_env(worker_env(job(), 0, CLUSTER_PEERS))
    assert default.memory_allocator == MemoryAllocator.TCMALLOC
    chosen = worker_env(job(workers={"replicas": 3, "memoryAllocator": "tensorflow"}), 0, CLUSTER_PEERS)
    assert WorkerContract.from_env(chosen).memory_allocator == MemoryAllocator.TENSORFLOW
    with pytest.raises(RuntimeError, match="CARAMEL_MEMORY_ALLOCATOR is 'jemalloc'; it must be one of tcmalloc, tensorflow"):
        WorkerContract.from_env({**chosen, "CARAMEL_MEMORY_ALLOCATOR": "jemalloc"})


def test_user_env_is_added_and_may_override_defaults():
    env = worker_env(job(env=[{"name": "TF_CPP_MIN_LOG_LEVEL", "value": "0"}, {"name": "DATA", "value": "/data"}]), 0, CLUSTER_PEERS)
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "0"
    assert env["DATA"] == "/data"
    assert "TF_USE_LEGACY_KERAS" not in env  # Keras 3, TensorFlow's own


def test_worker_command_runs_the_entrypoint_with_the_script_or_command():
    assert worker_command(job(), python="/venv/bin/python") == [
        "/venv/bin/python", "-m", "caramel.launch.entrypoint", "--", "/venv/bin/python", "train.py", "--steps", "3",
    ]
    with_command = job(script=None, command=["bash", "-c", "train"])
    assert worker_command(with_command)[-5:] == ["bash", "-c", "train", "--steps", "3"]


def test_wrong_peer_count_and_index_are_rejected():
    with pytest.raises(ValueError, match="expected 3 peer addresses"):
        worker_env(job(), 0, ["a", "b"])
    with pytest.raises(ValueError, match="outside 0..2"):
        worker_env(job(), 3, CLUSTER_PEERS)


def test_contract_outside_a_worker_says_how_to_start_one():
    with pytest.raises(RuntimeError, match="start jobs with `caramel run` or the operator"):
        WorkerContract.from_env({})


def test_worker_names_are_stable():
    assert worker_name(job(), 2) == "demo-worker-2"


def test_transport_addresses_reach_every_rank_in_both_modes():
    the_job = job(caramel={"transportPort": 29600})
    cluster = WorkerContract.from_env(next(process_envs(the_job, CLUSTER_PEERS)))
    assert cluster.transport_addresses == [(peer, 29600 + slot) for peer in CLUSTER_PEERS for slot in range(2)]
    local = WorkerContract.from_env(next(process_envs(the_job, ["127.0.0.1"] * 3)))
    assert local.transport_addresses == [("127.0.0.1", 29600 + rank) for rank in range(6)]
    # Every process listens where the others look for it.
    for peers in (CLUSTER_PEERS, ["127.0.0.1"] * 3):
        envs = list(process_envs(the_job, peers))
        listed = WorkerContract.from_env(envs[0]).transport_addresses
        assert [int(env["CARAMEL_TRANSPORT_PORT"]) for env in envs] == [port for _, port in listed]


def test_a_ring_job_gets_no_transport_port_and_every_job_its_peers_and_collective_ports():
    env = worker_env(job(caramel={"allreduce": "ring"}), 0, CLUSTER_PEERS)
    assert "CARAMEL_TRANSPORT_PORT" not in env
    assert env["CARAMEL_PEERS"] == ",".join(CLUSTER_PEERS)
    contract = WorkerContract.from_env({**env, **slot_env(env, 1)})
    # TensorFlow's servers listen on the ports after the rendezvous port, a port per slot.
    first = job().spec.rendezvous.port + 1
    assert contract.collective_addresses == [(peer, first + slot) for peer in CLUSTER_PEERS for slot in range(2)]
    with pytest.raises(RuntimeError, match="CARAMEL_PEERS is unset"):
        WorkerContract.from_env({key: value for key, value in {**env, **slot_env(env, 0)}.items() if key != "CARAMEL_PEERS"}).collective_addresses


def test_topology_round_trips_and_defaults_to_flat():
    placed = racks(2, 3, 1e9, 2.5e8)
    env = worker_env(job(), 1, CLUSTER_PEERS, topology=to_wire(placed))
    assert job_topology(WorkerContract.from_env(env)) == placed
    flat = job_topology(WorkerContract.from_env(worker_env(job(), 1, CLUSTER_PEERS)))
    assert flat.size == 6 and len(set(flat.groups)) == 1
    assert choose_allreduce(flat, 256 * 2**20) == "ring"


def test_topology_must_have_one_host_per_rank():
    with pytest.raises(ValueError, match="the topology has 4 hosts, the gang 6 ranks"):
        worker_env(job(), 0, CLUSTER_PEERS, topology=to_wire(racks(2, 2, 1e9, 1e9)))
    env = worker_env(job(), 0, CLUSTER_PEERS)
    with pytest.raises(RuntimeError, match="CARAMEL_TOPOLOGY: not a topology"):
        WorkerContract.from_env({**env, "CARAMEL_TOPOLOGY": '{"v": 2}'})


def test_ranks_re_formed_without_a_worker_get_the_topology_and_addresses_of_the_workers_in_their_round():
    """An elastic gang of 3 that lost worker 1: the round's ranks are workers 0 and 2 (issue 50:
    CARAMEL_TOPOLOGY of the whole gang against a HOROVOD_SIZE of 4 failed every survivor)."""
    the_job = job(replicas=3, min_replicas=2, caramel={"transportPort": 29600})
    placed = racks(3, 2, 1e9, 2.5e8)  # a rack per worker, a host per rank
    gang = [list(process_envs(the_job, peers, to_wire(placed))) for peers in (CLUSTER_PEERS, ["127.0.0.1"] * 3)]
    round_of_two = Round(1, (Host("demo-worker-0", 2), Host("demo-worker-2", 2)))
    for envs in gang:
        whole = WorkerContract.from_env(envs[4])
        survivor = WorkerContract.from_env({**envs[4], **round_of_two.rank_env("demo-worker-2", 0)})
        assert (survivor.required_rank, survivor.world_size, survivor.round_workers) == (2, 4, (0, 2))
        assert job_topology(survivor).hosts == tuple(placed.hosts[rank] for rank in (0, 1, 4, 5))
        assert job_topology(survivor).groups == tuple(placed.groups[rank] for rank in (0, 1, 4, 5))
        # Every worker keeps the ports it listens on: rank 2 is worker 2's first process.
        for addresses in ("transport_addresses", "collective_addresses"):
            started = getattr(whole, addresses)
            assert getattr(survivor, addresses) == [started[rank] for rank in (0, 1, 4, 5)], addresses
        assert survivor.transport_addresses[2][1] == int(envs[4]["CARAMEL_TRANSPORT_PORT"])
    with pytest.raises(RuntimeError, match="CARAMEL_ROUND_WORKERS names demo-worker-7, which CARAMEL_HOSTS"):
        WorkerContract.from_env({**gang[0][0], "CARAMEL_ROUND_WORKERS": "demo-worker-7"})
    with pytest.raises(RuntimeError, match="CARAMEL_TOPOLOGY has 6 hosts; the gang of CARAMEL_HOSTS has 4 ranks"):
        WorkerContract.from_env(worker_env(the_job, 0, CLUSTER_PEERS[:2]) | {"CARAMEL_TOPOLOGY": to_wire(placed).to_json()})


def test_a_direct_network_keeps_the_hosts_of_workers_left_out_as_nodes_that_forward():
    grid = to_wire(torus(2, 3, 1e9))
    network = from_wire(grid.of_hosts([0, 2, 3, 5]))  # still connected: hosts 1 and 4 forward
    assert network.hosts == tuple(grid.hosts[host] for host in (0, 2, 3, 5))
    assert network.switches == (grid.hosts[1], grid.hosts[4])
    assert len(network.links) == len(from_wire(grid).links)
    with pytest.raises(ValueError, match="are not distinct hosts of 0..5"):
        grid.of_hosts([0, 0])


def test_every_worker_waits_for_the_others_as_long_as_the_contract_says():
    """Worker 0's Gloo obeys HOROVOD_GLOO_TIMEOUT_SECONDS (30 s unset, which a peer pending for
    CPU or pulling its image outlasted); the others' wait for worker 0 reads the same variable."""
    the_job = job()
    for index in range(3):
        env = worker_env(the_job, index, CLUSTER_PEERS)
        assert env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == str(RENDEZVOUS_TIMEOUT_SECONDS)
        assert WorkerContract.from_env(env).rendezvous_timeout_seconds == RENDEZVOUS_TIMEOUT_SECONDS
    longer = worker_env(the_job, 0, CLUSTER_PEERS, rendezvous_timeout_seconds=900.5)
    assert longer["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "901"
    # spec.env has the last word, as for every variable.
    chosen = job(env=[{"name": "HOROVOD_GLOO_TIMEOUT_SECONDS", "value": "60"}])
    assert WorkerContract.from_env(worker_env(chosen, 1, CLUSTER_PEERS)).rendezvous_timeout_seconds == 60


def test_a_gang_short_of_workers_is_a_world_of_its_own_that_knows_the_full_size():
    """spec.workers.minReplicas: the peers given are the gang; Horovod's world is theirs, and
    CARAMEL_FULL_SIZE keeps the whole gang's ranks for scripts that keep its global batch."""
    elastic = job(replicas=4, min_replicas=2)
    peers = CLUSTER_PEERS  # 3 of the 4 workers
    envs = list(process_envs(elastic, peers))
    assert {(env["HOROVOD_SIZE"], env["HOROVOD_CROSS_SIZE"], env["CARAMEL_FULL_SIZE"]) for env in envs} == {("6", "3", "8")}
    assert envs[0]["CARAMEL_HOSTS"] == "demo-worker-0:2,demo-worker-1:2,demo-worker-2:2"
    contracts = [WorkerContract.from_env(env) for env in envs]
    assert {(c.world_size, c.full_world_size) for c in contracts} == {(6, 8)}
    assignments = get_host_assignments(parse_hosts(envs[0]["CARAMEL_HOSTS"]), 6)
    assert [int(env["HOROVOD_RANK"]) for env in envs] == [slot.rank for slot in assignments]
    for count in (1, 5):
        with pytest.raises(ValueError, match=f"expected 2 to 4 peer addresses \\(spec.workers.minReplicas to replicas\\), got {count}"):
            worker_env(elastic, 0, ["a"] * count)
    # A contract from before CARAMEL_FULL_SIZE: the world it runs in is the whole gang.
    older = {key: value for key, value in envs[0].items() if key != "CARAMEL_FULL_SIZE"}
    assert WorkerContract.from_env(older).full_world_size == 6


def test_a_global_batch_is_shared_among_the_ranks_that_run():
    envs = list(process_envs(job(replicas=3, slots=1), CLUSTER_PEERS))
    shares = [WorkerContract.from_env(env).share_of(256) for env in envs]
    assert shares == [86, 85, 85] and sum(shares) == 256
    assert [WorkerContract.from_env(env).share_of(96) for env in envs] == [32, 32, 32]
    with pytest.raises(ValueError, match="a global batch of 2 cannot give each of 3 ranks an example"):
        WorkerContract.from_env(envs[0]).share_of(2)
    with pytest.raises(RuntimeError, match="HOROVOD_RANK is unset"):
        WorkerContract.from_env(worker_env(job(), 0, CLUSTER_PEERS)).share_of(256)


def test_a_gang_on_one_machine_binds_each_port_once_and_says_where_each_comes_from():
    ports = PortMap.of(job(replicas=2, slots=1, rendezvous={"port": 29500}, metrics={"port": 29502}, caramel={"allreduce": "multitree", "transportPort": 29600}))
    assert ports.on_one_machine(2) == {
        29500: "spec.rendezvous.port",
        29501: "spec.rendezvous.port + 1, the collective port (+0 for rank 0)",
        29502: "spec.rendezvous.port + 1, the collective port (+1 for rank 1)",  # the collective port's claim comes first
        29503: "spec.metrics.port (+1 for rank 1)",
        29600: "spec.caramel.transportPort (+0 for rank 0)",
        29601: "spec.caramel.transportPort (+1 for rank 1)",
    }
    ring = PortMap.of(job(metrics={"enabled": False}, caramel={"allreduce": "ring"}))
    assert (ring.metrics, ring.transport, ring.collective) == (None, None, ring.rendezvous + 1)
    assert list(ring.of_one_worker(9000)) == [9000, 9001]


def test_the_restart_policy_doubles_its_backoff_up_to_its_longest_and_stops_at_the_limit():
    policy = RestartPolicy.of(job(runPolicy={"backoffLimit": 2, "activeDeadlineSeconds": 60}))
    assert [policy.backoff(restarts) for restarts in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert [policy.may_restart(restarts) for restarts in range(3)] == [True, True, False]
    assert not policy.deadline_passed(59.9) and policy.deadline_passed(60)
    operator = RestartPolicy.of(job(), first_backoff_seconds=10, max_backoff_seconds=60)
    assert [operator.backoff(restarts) for restarts in range(4)] == [10, 20, 40, 60] and not operator.deadline_passed(1e9)


BEFORE = ScriptRaised(before_first_step=True)
UNKNOWN = ScriptRaised(before_first_step=False)


@pytest.mark.parametrize(
    ("raised", "no_step_seen", "fails"),
    [
        ([UNKNOWN, BEFORE], False, True),  # every failed worker raised; rank 0's says it did no step
        ([BEFORE], False, True),
        ([UNKNOWN], True, True),  # the judge saw rank 0 report no step itself (caramel run)
        ([UNKNOWN, UNKNOWN], False, False),  # no word that no step was done: it may have been bad data at step 500
        ([UNKNOWN, None], False, False),  # a worker failed otherwise: lost, killed, a peer's failure
        ([None, BEFORE], True, False),
        ([], True, False),
    ],
)
def test_a_gang_whose_every_failed_worker_raised_before_the_first_step_fails_at_once(raised, no_step_seen, fails):
    assert RestartPolicy.of(job()).fails_at_once(raised, no_step_seen) is fails
    restarting = RestartPolicy.of(job(runPolicy={"restartOnScriptError": True}))
    assert not restarting.fails_at_once(raised, no_step_seen)


def test_the_operator_waits_a_moment_for_rank_0s_word_only_where_it_could_fail_the_job():
    policy = RestartPolicy.of(job())
    assert policy.awaits_rank_0([UNKNOWN], rank_0_runs=True, seconds_since_failure=0.5)
    assert not policy.awaits_rank_0([UNKNOWN], rank_0_runs=True, seconds_since_failure=SCRIPT_ERROR_WAIT_SECONDS)
    assert not policy.awaits_rank_0([UNKNOWN], rank_0_runs=False, seconds_since_failure=0.5)  # its worker ended or never ran
    assert not policy.awaits_rank_0([UNKNOWN, None], rank_0_runs=True, seconds_since_failure=0.5)
    assert not RestartPolicy.of(job(runPolicy={"restartOnScriptError": True})).awaits_rank_0([UNKNOWN], True, 0.5)
