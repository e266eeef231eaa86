"""Privacy: epsilon of (m, n, gamma), the plan, the guarantee, the ledger. Imports: floor, primitives."""
