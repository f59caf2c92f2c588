"""Lightning on s3ckpt: a ``CheckpointIO`` plug-in, and a sharded strategy for FSDP2 / TP.

::

    from lightning.pytorch import Trainer
    from s3ckpt.lightning import S3CheckpointIO, S3ModelCheckpoint

    ckpt = S3ModelCheckpoint(dirpath="s3://bucket/runs/exp1", monitor="val_loss",
                             save_top_k=2, save_last=True)
    trainer = Trainer(callbacks=[ckpt], plugins=[S3CheckpointIO(policy="pretraining")])
    trainer.fit(model, ckpt_path="last")          # resumes when there is a last.ckpt

What happens to Lightning's calls:

* ``save_checkpoint(checkpoint, "s3://.../epoch=0-step=4.ckpt")`` (rank 0): the checkpoint
  dict is flattened exactly (:func:`s3ckpt.tools.flatten_state_dict` with ``objects=True``:
  container and key types survive, so the optimizer's int-keyed state comes back as it
  was) and saved as one DCP checkpoint under that name, a prefix, by
  :class:`~s3ckpt.dcp.S3StorageWriter`: parallel multipart upload, CRC32C per item, the
  commit marker ``s3ckpt.json`` last, the step (``global_step``) and each
  ``ModelCheckpoint``'s monitored score recorded in it (so ``s3ckpt ls`` shows the step and
  ``KeepBest`` can rank by the metric). Lightning rewrites ``last.ckpt`` on every save and
  names are reused after a resume, so every save is a **safe overwrite**
  (``overwrite=True``): the checkpoint already there stays loadable until the new one has
  committed, and a failed save leaves it intact.
* ``load_checkpoint(path, weights_only=...)`` (every rank): read back with parallel ranged
  GETs, every CRC32C checked. Non-tensor values (hyperparameters, loop state) are
  unpickled by the safe loader with s3ckpt's allow-list (:data:`s3ckpt.dcp.SAFE_GLOBALS`)
  plus ``safe_globals``; Lightning's ``weights_only=False`` means "I trust this bucket"
  and loads them with full pickle instead. The dict has Lightning's normal shape (a
  sharded checkpoint of :class:`S3ModelParallelStrategy` too: full tensors). A stock
  Lightning checkpoint, one ``torch.save`` object (written through s3fs before the move),
  is streamed and loaded under the same rules, so ``fit(ckpt_path="s3://.../last.ckpt")``
  resumes it; a committed s3ckpt checkpoint at the same name wins. Nothing there raises
  :class:`~s3ckpt.errors.CheckpointNotFoundError`, also a ``FileNotFoundError``.
* ``remove_checkpoint(path)`` (``save_top_k`` dropping a checkpoint; rank 0):
  :func:`s3ckpt.retention.delete_checkpoint`: marker first, under the run's lease. A
  removal is carried out once no save of that path is uploading and no ``ModelCheckpoint``
  tracks it any more, so ``AsyncCheckpointIO(S3CheckpointIO())`` works: a checkpoint
  removed while its save is queued or uploading is deleted after it commits. A refusal that
  passes (the run's newest, a save writing it, a pruner's lease) is retried after each
  later commit and at teardown; a pinned checkpoint is never deleted
  (:mod:`s3ckpt.lightning._async`).
* ``policy``: a retention policy run on rank 0 after each commit, in the background, over
  the run (the checkpoint's parent prefix); its passes are kept in
  :attr:`S3CheckpointIO.retention_history`. Whatever the policy, it never deletes what a
  ``ModelCheckpoint`` tracks (``best_k_models``, ``best_model_path``,
  ``kth_best_model_path``, ``last_model_path``, as the checkpoint being saved records
  them): the plug-in runs ``policy | KeepTracked(...)``.

Importing this package changes nothing in Lightning, fsspec or torch. What a Trainer using
the plug-in needs is installed (idempotent, for the process) when an :class:`S3CheckpointIO`
is constructed (:class:`S3ModelParallelStrategy` makes one when given none):

* when s3fs is not installed (and no other file system is registered for ``s3://``), a
  small s3ckpt-backed fsspec file system for ``s3://`` and ``s3a://``, complete enough for
  ``ModelCheckpoint`` and Lightning's loggers (``CSVLogger("s3://...")``: folders,
  ``metrics.csv`` appends, ``hparams.yaml``), see :mod:`s3ckpt.lightning._last`. s3fs, when
  installed, keeps ``s3://`` (``S3CheckpointIO(register_filesystem=True)`` replaces it);
* ``ckpt_path="last"`` for object-store folders, whichever file system owns the scheme:
  the candidates keep their scheme, and the newest is chosen by the store's time (an
  s3ckpt checkpoint's commit marker), since s3fs cannot time a prefix
  (:mod:`s3ckpt.lightning._last`);
* ``AsyncCheckpointIO.teardown`` also tears the wrapped s3ckpt plug-in down (Lightning's
  does not), so the last removals and retention passes finish with ``fit``.

A ``ModelCheckpoint`` (or a logger) on ``s3://`` built *before* the plug-in needs the file
system then: use :class:`S3ModelCheckpoint`, which registers it when constructed. Only
:func:`install`, called explicitly, also hooks ``MyModule.load_from_checkpoint("s3://...")``
(and ``LightningDataModule.load_from_checkpoint``): Lightning's ``pl_load`` is wrapped so
that a remote path holding an s3ckpt checkpoint (or, without s3fs, any ``s3://`` path) is
read as ``load_checkpoint`` reads it, ``map_location`` and ``weights_only`` honoured;
everything else goes to Lightning's own function (:mod:`s3ckpt.lightning._load`).

Stores are shared with the rest of the process (:meth:`s3ckpt.store.Location.of`). Where
no plug-in is at hand (``load_from_checkpoint``, the file system), a bucket is opened with
the settings of the plug-in that last opened it, else of the last plug-in constructed, else
the environment's (``AWS_ENDPOINT_URL``, profile, region): :mod:`s3ckpt.lightning._async`.

Sharded strategies (``ModelParallelStrategy``, i.e. FSDP2 and tensor parallelism) do not use
``CheckpointIO`` for sharded state: use :class:`S3ModelParallelStrategy`, which saves every
rank's shards through s3ckpt into one checkpoint (and loads it back at any world size).

Needs ``pip install "s3ckpt[lightning]"``.
"""

from __future__ import annotations

from s3ckpt.lightning._io import S3CheckpointIO, S3ModelCheckpoint, S3ModelParallelStrategy
from s3ckpt.lightning._last import setup
from s3ckpt.lightning._load import install_load_hook

__all__ = ["S3CheckpointIO", "S3ModelCheckpoint", "S3ModelParallelStrategy", "install"]


def install() -> None:
    """Install everything the package's docstring lists, for the whole process: the
    ``s3://`` file system when s3fs is missing, ``ckpt_path="last"`` by store time, the
    ``AsyncCheckpointIO`` teardown and the ``load_from_checkpoint`` hook.

    Never called at import: call it once before ``load_from_checkpoint("s3://...")`` (a
    plug-in installs the rest when constructed). Idempotent; call it again after replacing
    any of those Lightning functions yourself."""
    setup(None)
    install_load_hook()
