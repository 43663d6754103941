"""Data quality of an output version: Great Expectations validation and the HTML report."""
