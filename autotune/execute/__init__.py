"""Running a trial, behind one seam (`base`): the local executor (`local`: worker processes of
this host) and the simulated one (`simulated`: answers without a process, cost included)."""
