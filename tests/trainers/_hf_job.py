"""A small Hugging Face Trainer job the trainer tests run (a tiny BERT built in code: nothing downloaded)."""

from __future__ import annotations

import torch


def dataset(n=64, seq=8, vocab=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (n, seq), generator=g)
    labels = (ids[:, 0] > vocab // 2).long()

    class DS(torch.utils.data.Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            return {"input_ids": ids[i], "attention_mask": torch.ones(seq, dtype=torch.long), "labels": labels[i]}

    return DS()


def model(seed=0, vocab=40):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=vocab, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=16, num_labels=2)
    return BertForSequenceClassification(cfg)


class RecordingCallback:
    """Reads, independently of tensortap, what the optimizer consumes: the gradients and weights at the moment
    the optimizer's step begins (a torch optimizer step pre-hook: the Trainer clipped before it)."""

    def __init__(self):
        self.records = []

    def install(self, trainer_model, optimizer):
        inner = getattr(optimizer, "optimizer", optimizer)

        def pre(opt, args, kwargs):
            self.records.append({
                "weights": {n: p.detach().clone() for n, p in trainer_model.named_parameters()},
                "grads": {n: p.grad.detach().clone() for n, p in trainer_model.named_parameters()
                          if p.grad is not None},
            })

        inner.register_step_pre_hook(pre)
