REFUSED: parallel.cp_comm=p2p has no torchtitan option: its context parallel all-gathers K/V (parallel.cp_comm: all_gather)
