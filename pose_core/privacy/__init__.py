"""Privacy filters applied to exported media (face blurring)."""
