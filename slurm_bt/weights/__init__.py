"""Weights delivery ("BDN"): mirror declared sources once into a cluster cache, stage them on nodes."""
