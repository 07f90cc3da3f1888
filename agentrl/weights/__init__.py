"""Weights from the learner to the engines, both ends: ordered pushes with a deadline (`sync`), the
collective path's wire (`collective`), its sending end on learner rank 0 (`push`), one engine's side as
the fleet drives it (`load`), the receiving end inside vLLM's workers (`receiver`), and the hand-over
files of the file path (`handover`). The learner and the rollout each import their end only."""
