"""A training job's life as a state machine (issue 19, part C): batches taken on every rank,
checkpoints through each path (in-process ``state_dict``, a plain DataLoader with
``loader_states``, torchdata's ``StatefulDataLoader``, tf.data with ``state_after``, Grain's
iterator ``get_state``/``set_state``, its ranks taking batches in lockstep), preemption
and resume with the same or another world size and number of workers, epochs started with or
without ``set_epoch`` or skipped, and the output re-run under the job.

The model is plain: per epoch, the set of records delivered over all ranks. Invariants:
- nothing is delivered twice in an epoch (across ranks, workers and resumes);
- at an epoch's end everything was delivered but at most what the splits' ``remainder="drop"``
  may leave out (fewer than ``world_size`` records per split);
- when the epoch was read by one split throughout (exact resumes only), every rank's stream is
  exactly the uninterrupted stream of that epoch;
- a checkpoint of one output is refused on a re-run with another seed, and accepted again on a
  re-run that writes the same bytes.

The same life is lived by a ``Mixture`` of two outputs (``MixtureLife``), whose epochs hold
records more than once: the model is then the epoch's multiset, made from each output's own
epochs read alone and the interleave's counts, and "nothing twice" becomes "nothing more often
than the epoch holds it".

``PILESHUFFLE_LIFE_EXAMPLES`` sets the number of lives (default: a few, for ``make test``).
"""

import collections
import itertools
import json
import os

import pytest
from helpers import run_shuffle, sample_run
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from pileshuffle.commands import sample
from pileshuffle.loader import Mixture, ShuffledDataset

pytestmark = [
    pytest.mark.filterwarnings("ignore:This DataLoader will create"),
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),
]

RECORDS = 301  # divisible by no world size below
BATCH = 16
SEED = 7  # the loader's seed
PATHS = ("inproc", "plain", "stateful", "tf", "grain")
IN_PROCESS = ("inproc", "tf", "grain")  # paths without DataLoader workers
EXAMPLES = int(os.environ.get("PILESHUFFLE_LIFE_EXAMPLES", "6"))


# a Mixture's weights, epoch length, second output's records
MIX_WEIGHTS, MIX_EPOCH, MIX_SECOND = (
    [2, 1],
    250,
    97,
)


def index(record) -> int:
    return sample.index_of(record)


def open_reader(prefix, rank, world, epoch):
    """The job's reader: one output, or (a tuple of two prefixes) a Mixture of both that
    restarts them (each output's own seed: SEED, SEED + 1)."""
    if isinstance(prefix, str):
        return ShuffledDataset(prefix, seed=SEED, rank=rank, world_size=world, epoch=epoch)
    sources = [ShuffledDataset(p, seed=SEED + i) for i, p in enumerate(prefix)]
    return Mixture(
        sources,
        MIX_WEIGHTS,
        seed=SEED,
        stop="restart",
        records_per_epoch=MIX_EPOCH,
        rank=rank,
        world_size=world,
        epoch=epoch,
    )


class Rank:
    """One rank of the job through one checkpoint path: its dataset, its loader, its stream."""

    def __init__(self, prefix, path, rank, world, workers, epoch, resume=None):
        self.path, self.workers = path, (0 if path in IN_PROCESS else workers)
        self.rank, self.pending = rank, None
        self.ds = open_reader(prefix, rank, world, epoch)
        self.key = index if isinstance(prefix, str) else bytes
        self.taken = 0  # batches (records for tf) of this epoch by this split, for loader_states / state_after
        self.loader, self.it = None, None
        if path in ("plain", "stateful"):
            from torch.utils.data import DataLoader
            from torchdata.stateful_dataloader import StatefulDataLoader

            self.tds = self.ds.torch(batch_size=BATCH)
            kind = DataLoader if path == "plain" else StatefulDataLoader
            self.loader = kind(self.tds, batch_size=None, num_workers=self.workers)
        elif path == "tf":
            self.tf = self.ds.tf(batch_size=BATCH)
        elif path == "grain":
            self.grain = self.ds.grain()
        if resume is not None:
            self.resume(resume)

    def resume(self, state):
        # an iterator's state; after an elastic change any old host's (all alike in lockstep)
        if self.path == "grain":
            self.pending = (
                state[min(self.rank, len(state) - 1)] if isinstance(state, list) else state
            )
        elif self.path == "stateful" and isinstance(state, dict) and "consumer" not in state:
            self.loader.load_state_dict(state)  # the loader's own state: exact
        elif self.path in ("plain", "stateful"):
            self.tds.load_state_dict(state)
        else:
            self.ds.load_state_dict(state)

    def set_epoch(self, epoch):
        (self.tds if self.path in ("plain", "stateful") else self.ds).set_epoch(epoch)

    def start_pass(self):
        if self.path in ("plain", "stateful"):
            self.it = iter(self.loader)
        elif self.path == "tf":
            self.it = iter(self.tf)
        elif self.path == "grain":
            self.it = iter(self.grain)
            if self.pending is not None:
                self.it.set_state(self.pending)
                self.pending = None
        else:
            self.it = iter(self.ds.batches(BATCH))

    def take(self, n) -> list:
        """Up to ``n`` batches as lists of record indexes (fewer at the pass's end)."""
        out = []
        for _ in range(n):
            try:
                batch = next(self.it) if self.path != "grain" else _batch_of(self.it)
            except StopIteration:
                break
            records = [
                self.key(r) for r in (batch.numpy().tolist() if self.path == "tf" else batch)
            ]
            self.taken += len(records) if self.path == "tf" else 1
            out.append(records)
        return out

    def checkpoint(self, epoch):
        """What this rank saves: its loader's state or its consumers' states (JSON round trip)."""
        from pileshuffle.loader.tf import state_in_epoch
        from pileshuffle.loader.torch_resume import loader_states

        if self.path == "plain":
            state = loader_states(self.tds, self.taken, num_workers=self.workers)
        elif self.path == "stateful":
            state = self.loader.state_dict()
        elif self.path == "tf":
            state = state_in_epoch(self.ds, epoch, self.taken)
        elif self.path == "grain":
            state = self.it.get_state()
        else:
            state = self.ds.state_dict()
        return json.loads(json.dumps(state))

    def consumer_states(self, saved) -> list:
        """The dataset states in ``saved`` (all of this rank's consumers), for an elastic resume."""
        from pileshuffle.loader.torch_resume import worker_states

        if self.path == "stateful":
            return worker_states(saved)
        return saved if isinstance(saved, list) else [saved]

    def close(self):
        self.it = None
        self.loader = None


def _batch_of(iterator) -> list:
    """The next ``BATCH`` records of a Grain iterator (fewer at the end; none: StopIteration)."""
    batch = list(itertools.islice(iterator, BATCH))
    if not batch:
        raise StopIteration
    return batch


class TrainingLife(RuleBasedStateMachine):
    prefix = None  # set by the test: a finished output of RECORDS records
    pattern = None

    @initialize(world=st.integers(1, 3), workers=st.integers(0, 2), path=st.sampled_from(PATHS))
    def start(self, world, workers, path):
        self.epoch, self.world, self.workers, self.path = 0, world, workers, path
        self.ranks = [Rank(self.prefix, path, r, world, workers, 0) for r in range(world)]
        self._new_epoch_model()
        for rank in self.ranks:
            rank.start_pass()

    def _new_epoch_model(self):
        self.delivered = collections.Counter()
        self.streams = [[] for _ in range(self.world)]  # per rank, batches of this epoch
        self.one_split = True  # no elastic resume in this epoch
        self.splits_dropped = self.world - 1  # records the splits' remainder may leave out

    @rule(rank=st.integers(0, 2), n=st.integers(1, 6))
    def take_batches(self, rank, n):
        """n batches on one rank; on the Grain path on every rank (synchronous training, which
        its elastic restore assumes)."""
        for rank in range(self.world) if self.path == "grain" else [rank % self.world]:
            batches = self.ranks[rank].take(n)
            self.streams[rank] += batches
            for batch in batches:
                self.delivered.update(batch)

    @rule(how=st.sampled_from(["set_epoch", "implicit", "skip"]))
    def finish_epoch(self, how):
        """Take every rank's remaining batches, check the epoch, start the next one."""
        for r, rank in enumerate(self.ranks):
            batches = rank.take(10**6)
            self.streams[r] += batches
            for batch in batches:
                self.delivered.update(batch)
        self.check_epoch_complete()
        self.epoch += 2 if how == "skip" else 1
        for rank in self.ranks:
            rank.taken = 0
            if how != "implicit":
                rank.set_epoch(self.epoch)
            rank.start_pass()
        self._new_epoch_model()

    @rule(world=st.integers(1, 3), workers=st.integers(0, 2), elastic=st.booleans())
    def preempt_and_resume(self, world, workers, elastic):
        """Every rank checkpoints; the job dies; a new job (new objects, as new processes
        would be) resumes, with the same split (exact) or another one (elastic)."""
        saved = [rank.checkpoint(self.epoch) for rank in self.ranks]
        old = self.ranks
        for rank in old:
            rank.close()
        if not elastic or (world, workers if self.path not in IN_PROCESS else 0) == (
            self.world,
            self.ranks[0].workers,
        ):
            self.ranks = [
                Rank(self.prefix, self.path, r, self.world, self.workers, self.epoch, saved[r])
                for r in range(self.world)
            ]
            for rank, before in zip(self.ranks, old):
                rank.taken = before.taken
        else:
            everything = [
                state for rank, one in zip(old, saved) for state in rank.consumer_states(one)
            ]
            self.world, self.workers = world, workers
            self.ranks = [
                Rank(self.prefix, self.path, r, world, workers, self.epoch, everything)
                for r in range(world)
            ]
            if (world, max(1, self.ranks[0].workers)) == (len(old), max(1, old[0].workers)):
                # 0 and 1 workers are one split: resumed exactly
                for rank, before in zip(self.ranks, old):
                    rank.taken = before.taken
            self.streams = [[] for _ in range(world)]
            self.one_split = False
            self.splits_dropped += world - 1
        for rank in self.ranks:
            rank.start_pass()

    @precondition(lambda self: self.path in ("inproc", "plain") and isinstance(self.prefix, str))
    @rule()
    def rerun_the_output_under_the_job(self):
        """The output is re-run with another seed (the checkpoint is refused), then with its
        own options again (same bytes: the checkpoint resumes exactly)."""
        saved = [rank.checkpoint(self.epoch) for rank in self.ranks]
        for rank in self.ranks:
            rank.close()
        run_shuffle(self.pattern, self.prefix, "--overwrite", "--num_piles=5", "--seed=2")
        with pytest.raises(ValueError, match="another output"):
            Rank(self.prefix, self.path, 0, self.world, self.workers, self.epoch, saved[0])
        run_shuffle(self.pattern, self.prefix, "--overwrite", "--num_piles=5", "--seed=1")
        old = self.ranks
        self.ranks = [
            Rank(self.prefix, self.path, r, self.world, self.workers, self.epoch, saved[r])
            for r in range(self.world)
        ]
        for rank, before in zip(self.ranks, old):
            rank.taken = before.taken
            rank.start_pass()

    def epoch_multiset(self, epoch) -> collections.Counter:
        """The model: every record of the output once."""
        return collections.Counter(range(RECORDS))

    @invariant()
    def nothing_repeats_in_an_epoch(self):
        if hasattr(self, "delivered"):
            held = self.epoch_multiset(self.epoch)
            repeated = [i for i, n in self.delivered.items() if n > held[i]]
            assert not repeated, (
                f"records delivered more often than epoch {self.epoch} holds them: {repeated[:10]}"
            )

    def check_epoch_complete(self):
        missing = sum((self.epoch_multiset(self.epoch) - self.delivered).values())
        assert 0 <= missing <= self.splits_dropped, (
            f"epoch {self.epoch}: {missing} records never delivered (the splits may drop {self.splits_dropped})"
        )
        if self.one_split:
            expected = uninterrupted(
                self.prefix, self.path, self.world, self.ranks[0].workers, self.epoch
            )
            for r in range(self.world):
                assert self.streams[r] == expected[r], (
                    f"rank {r}'s stream of epoch {self.epoch} is not the uninterrupted one"
                )

    def teardown(self):
        for rank in getattr(self, "ranks", []):
            rank.close()


_UNINTERRUPTED = {}


def uninterrupted(prefix, path, world, workers, epoch):
    """Every rank's batches (indexes) of ``epoch`` read without interruption by that split."""
    key = (path, world, workers, epoch)
    if key not in _UNINTERRUPTED:
        streams = []
        for r in range(world):
            rank = Rank(prefix, path, r, world, workers, epoch)
            rank.start_pass()
            streams.append(rank.take(10**6))
            rank.close()
        _UNINTERRUPTED[key] = streams
    return _UNINTERRUPTED[key]


@pytest.fixture(scope="module")
def job_output(tmp_path_factory):
    return sample_run(
        tmp_path_factory,
        "tfrecord",
        "--num_piles=5",
        "--seed=1",
        records=RECORDS,
        files=2,
        record_bytes=24,
    )


def test_a_training_jobs_life(job_output):
    TrainingLife.pattern, TrainingLife.prefix = job_output
    _UNINTERRUPTED.clear()
    run_state_machine_as_test(
        TrainingLife,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=8,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )


class MixtureLife(TrainingLife):
    """The same life through a Mixture of the job's output and a second one (``open_reader``)."""

    _held = {}

    def epoch_multiset(self, epoch) -> collections.Counter:
        """The model: output i's records at its stream positions [count_i(eL), count_i((e+1)L))
        of the interleave, its stream being its own epochs (read alone) back to back."""
        if (self.prefix, epoch) not in self._held:
            self._held[self.prefix, epoch] = self._epoch_multiset(epoch)
        return self._held[self.prefix, epoch]

    def _epoch_multiset(self, epoch) -> collections.Counter:
        mixture = open_reader(self.prefix, 0, 1, 0)
        held = collections.Counter()
        for i, prefix in enumerate(self.prefix):
            start, stop = (mixture._interleave.count(i, n * MIX_EPOCH) for n in (epoch, epoch + 1))
            stream, own_epoch = [], 0
            while len(stream) < stop:
                stream += list(ShuffledDataset(prefix, seed=SEED + i, epoch=own_epoch))
                own_epoch += 1
            held.update(stream[start:stop])
        return held


@pytest.fixture(scope="module")
def second_output(tmp_path_factory):
    return sample_run(
        tmp_path_factory,
        "tfrecord",
        "--num_piles=3",
        "--seed=4",
        records=MIX_SECOND,
        files=1,
        record_bytes=24,
        seed=9,
    )[1]


def test_a_training_jobs_life_on_a_mixture(job_output, second_output):
    MixtureLife.pattern, MixtureLife.prefix = None, (job_output[1], second_output)
    _UNINTERRUPTED.clear()
    run_state_machine_as_test(
        MixtureLife,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=8,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    _UNINTERRUPTED.clear()


def test_a_mixture_through_grain_resumed_elastically_twice_repeats_no_record(
    job_output, second_output
):
    """The example hypothesis found in the mixture's life, replayed step by step: the first
    elastic restore dealt the rest unequally (51, 51, 52), the hosts ran out one record apart,
    and the second restored host 0's state (51 in) as every host's, reading host 2's last record
    again (Grain's elastic restores now deal equal parts)."""
    MixtureLife.pattern, MixtureLife.prefix = None, (job_output[1], second_output)
    _UNINTERRUPTED.clear()
    life = MixtureLife()
    try:
        life.start(world=2, workers=0, path="grain")
        life.take_batches(n=3, rank=0)
        life.preempt_and_resume(elastic=True, workers=0, world=3)
        life.take_batches(n=4, rank=0)
        life.nothing_repeats_in_an_epoch()
        life.preempt_and_resume(elastic=True, workers=0, world=1)
        life.take_batches(n=1, rank=0)
        life.nothing_repeats_in_an_epoch()
    finally:
        life.teardown()
        _UNINTERRUPTED.clear()
