"""Lightning on s3ckpt: a ``CheckpointIO`` plug-in, and a sharded strategy for FSDP2 / TP.

::

    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint
    from s3ckpt.lightning import S3CheckpointIO

    ckpt = ModelCheckpoint(dirpath="s3://bucket/runs/exp1", monitor="val_loss",
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
  and loads them with full pickle instead.
* ``remove_checkpoint(path)`` (``save_top_k`` dropping a checkpoint; rank 0):
  :func:`s3ckpt.retention.delete_checkpoint`: marker first, under the run's lease; a
  checkpoint that is pinned, being written or the run's newest is refused with a warning
  and left to retention, never deleted by force.
* ``policy``: a retention policy run on rank 0 after each commit, in the background, over
  the run (the checkpoint's parent prefix); its passes are kept in
  :attr:`S3CheckpointIO.retention_history`. Choose one that keeps what ``save_top_k``
  tracks (say ``KeepLast(2) | KeepBest(3, "val_loss")``) or Lightning's ``ckpt_path="best"``
  may name a pruned checkpoint.

``ModelCheckpoint`` itself lists, checks and time-stamps its folder through fsspec. When s3fs
is not installed, the plug-in registers a small s3ckpt-backed fsspec file system for
``s3://`` (``register_filesystem``), so an ``s3://`` dirpath works without s3fs; it also
fixes ``ckpt_path="last"`` for object-store folders (Lightning normalises ``s3://b/x`` to
``s3:/b/x`` and then finds nothing).

Sharded strategies (``ModelParallelStrategy``, i.e. FSDP2 and tensor parallelism) do not use
``CheckpointIO`` for sharded state: use :class:`S3ModelParallelStrategy`, which saves every
rank's shards through s3ckpt into one checkpoint (and loads it back at any world size).

Needs ``pip install "s3ckpt[lightning]"``.
"""

from __future__ import annotations

from s3ckpt.lightning._fs import _fix_find_last_checkpoints, _install_filesystem
from s3ckpt.lightning._io import S3CheckpointIO
from s3ckpt.lightning._strategy import S3ModelParallelStrategy

__all__ = ["S3CheckpointIO", "S3ModelParallelStrategy"]

_install_filesystem(None, None, None)
_fix_find_last_checkpoints()
