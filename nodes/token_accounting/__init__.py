"""Token accounting: what each model call cost, per call, turn and session, kept as data a checkpoint can store."""
