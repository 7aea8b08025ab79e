"""prepare_dataset: instruction data in, tokenized train/eval splits out."""
