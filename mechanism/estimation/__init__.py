"""Estimates from perturbed counts: A^-1, MLE, intervals, marginals. Imports: floor, primitives, privacy."""
