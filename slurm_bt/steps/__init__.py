"""Job steps on compute nodes, as the job user, started by the rendered scripts: step 1
(:mod:`.prepare`), the leader address (:mod:`.leader`), the checkpoint agent (:mod:`.checkpoint_agent`)
and the weights staging job (:mod:`.stage_weights`).
"""
