"""The trajectory viewer (`searchr1 view RUN_DIR`): a small FastAPI app with server-rendered pages over a
run's Parquet trajectory archive: the run's curves and collapse signals, each trajectory turn by turn with
its loss mask, and each question across steps."""
