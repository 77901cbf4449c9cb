"""Job steps on compute nodes, as the job user, started by the rendered batch script: step 1
(:mod:`.prepare`), the leader address (:mod:`.leader`) and the checkpoint agent (:mod:`.checkpoint_agent`).
"""
