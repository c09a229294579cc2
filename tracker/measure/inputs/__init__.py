"""Feeds: generated valid from the model's inputs, or read from `.npz`/`.npy` files."""
