"""trainbus inside other trainers' loops: :mod:`trainer.integrations.trl` brings the bus, votes,
stall diagnosis and exporters to a Hugging Face ``Trainer`` (TRL's ``GRPOTrainer``)."""
