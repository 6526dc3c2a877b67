"""The interactive report: `data` builds plain data from the records (no plotly), `html` draws."""
