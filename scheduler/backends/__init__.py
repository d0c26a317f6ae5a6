"""Batch backends. `local` is the in-process default (no object needed); `celery` fans out chords."""
