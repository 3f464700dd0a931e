"""``manifest.json``: what a harvest folder holds, how it was made, and how to check it.

Written by rank 0: once when a run starts (``complete: false``, no shards), so a
rerun can tell whether it continues the same harvest, and again after every
rank has finished (``complete: true``, every shard with its context range and
sha256). Writing into a folder whose manifest disagrees with the run, in the
fingerprint (see ``fingerprint``), the corpus' tokens or the shard layout, is
refused with the fields that differ.
"""

from dataclasses import asdict, dataclass, field
from pathlib import Path

from interp_transformer.harvest.fingerprint import differences
from interp_transformer.harvest.storage import MANIFEST_FILE, TOKENS_FILE, atomic_write_json, read_json, sha256_of_file

FORMAT = "interp_transformer.harvest/1"


@dataclass
class ShardRecord:
    """One shard file: contexts ``[first_context, stop_context)`` and the sha256 of its bytes."""

    index: int
    file: str
    first_context: int
    stop_context: int
    sha256: str
    bytes: int
    content_hash: str

    @property
    def n_contexts(self) -> int:
        return self.stop_context - self.first_context


@dataclass
class Manifest:
    """The parsed ``manifest.json`` of a harvest folder (``Manifest.read(out_dir)``)."""

    out_dir: Path
    complete: bool
    content_hash: str
    fingerprint: dict
    tokens: dict  # file, sha256 (of the file), tokens_sha256 (of the ids), n_contexts, counts
    layout: dict  # batch_size, shard_contexts, n_shards
    hooks: list  # [{"name", "shape", "pos_axes"}], shape per context
    shards: list = field(default_factory=list)  # [ShardRecord]
    model: str = ""
    corpus: str = ""
    world_size: int = 1
    format: str = FORMAT

    # ---- reading and writing ------------------------------------------------------------
    @classmethod
    def read(cls, out_dir: str | Path) -> "Manifest":
        out_dir = Path(out_dir)
        path = out_dir / MANIFEST_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"no {MANIFEST_FILE} in {out_dir}: not a harvest folder, or the harvest never started"
            )
        data = read_json(path)
        if data.get("format") != FORMAT:
            raise ValueError(f"{path} has format {data.get('format')!r}, expected {FORMAT!r}")
        shards = [ShardRecord(**record) for record in data.pop("shards", [])]
        data.pop("format")
        return cls(out_dir=out_dir, shards=shards, **data)

    @classmethod
    def exists(cls, out_dir: str | Path) -> bool:
        return (Path(out_dir) / MANIFEST_FILE).is_file()

    def to_json(self) -> dict:
        data = asdict(self)
        data.pop("out_dir")
        return {"format": data.pop("format"), **data}

    def write(self) -> None:
        atomic_write_json(self.out_dir / MANIFEST_FILE, self.to_json())

    # ---- what the folder holds ------------------------------------------------------------
    @property
    def n_contexts(self) -> int:
        return int(self.tokens["n_contexts"])

    @property
    def context_length(self) -> int:
        return int(self.fingerprint["context_length"])

    @property
    def hook_names(self) -> list[str]:
        return [hook["name"] for hook in self.hooks]

    def hook_shape(self, name: str) -> tuple[int, ...]:
        """Shape of one context's activation at hook ``name``."""
        for hook in self.hooks:
            if hook["name"] == name:
                return tuple(hook["shape"])
        raise KeyError(f"this harvest holds no hook {name!r}; it holds {self.hook_names}")

    def hook_pos_axes(self, name: str) -> tuple[int, ...]:
        self.hook_shape(name)
        return tuple(next(h["pos_axes"] for h in self.hooks if h["name"] == name))

    @property
    def tokens_path(self) -> Path:
        return self.out_dir / self.tokens.get("file", TOKENS_FILE)

    def total_tokens(self) -> int:
        return self.n_contexts * self.context_length

    # ---- checks ---------------------------------------------------------------------------
    def comparable(self) -> dict:
        """The fields a run must agree on to write into this folder."""
        return {
            **self.fingerprint,
            "tokens_sha256": self.tokens["tokens_sha256"],
            "n_contexts": self.n_contexts,
            "batch_size": self.layout["batch_size"],
            "shard_contexts": self.layout["shard_contexts"],
        }

    def refuse_if_different(self, current: dict) -> None:
        """``ValueError`` naming each field where ``current`` (a ``comparable()`` dict) differs."""
        lines = differences(self.comparable(), current)
        if lines:
            listed = "\n  ".join(lines)
            raise ValueError(
                f"refusing to write into {self.out_dir}: its manifest was made with different settings, and mixing "
                f"them would give activations that disagree. Fields that differ:\n  {listed}\n"
                "Harvest into a new folder, or delete this one to start over."
            )

    def problems(self, check_hashes: bool = True) -> list[str]:
        """Everything wrong with the folder against this manifest (empty when it is sound).

        Checks that the harvest is complete, that the shards cover every context
        exactly once, and (``check_hashes``) that every file has its recorded sha256.
        """
        found = []
        if not self.complete:
            found.append("the harvest is not complete (a run was stopped): rerun the same command to finish it")
        covered = sorted((s.first_context, s.stop_context) for s in self.shards)
        expected_start = 0
        for first, stop in covered:
            if first != expected_start:
                found.append(f"contexts [{expected_start}, {first}) are missing or covered twice")
            expected_start = max(expected_start, stop)
        if self.complete and expected_start != self.n_contexts:
            found.append(f"the shards cover contexts [0, {expected_start}), expected [0, {self.n_contexts})")
        if len({s.file for s in self.shards}) != len(self.shards):
            found.append("a shard file is listed twice")
        if check_hashes:
            if not self.tokens_path.is_file() or sha256_of_file(self.tokens_path) != self.tokens["sha256"]:
                found.append(f"{self.tokens_path.name} is missing or its sha256 differs from the manifest")
            for shard in self.shards:
                path = self.out_dir / shard.file
                if not path.is_file():
                    found.append(f"{shard.file} is missing")
                elif sha256_of_file(path) != shard.sha256:
                    found.append(f"{shard.file}: sha256 differs from the manifest (the file changed or is damaged)")
        return found

    def verify(self, check_hashes: bool = True) -> "Manifest":
        """Raise ``ValueError`` listing the folder's problems; return ``self`` when there are none."""
        found = self.problems(check_hashes)
        if found:
            raise ValueError(f"the harvest in {self.out_dir} is not sound:\n  " + "\n  ".join(found))
        return self
