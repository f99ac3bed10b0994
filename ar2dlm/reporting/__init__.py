"""Tables, figures, claims and summaries, rebuilt from the results folder."""
