"""Count-level Monte Carlo and Sec. IV data sets. Imports: floor, primitives, privacy, estimation."""
