"""Metrics through ir-measures (pytrec_eval underneath), DPR-style QA accuracy, reports."""
