"""What a study gives its user, read from one snapshot of it: the front and the picks, their
confirmation, the study folder's tables, the exports, the report and the terminal view."""
