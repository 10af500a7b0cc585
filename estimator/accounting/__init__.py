"""Privacy accounting on the server: (ε, δ) figures for privacy events
(:mod:`.accountant`), amplification by shuffling (:mod:`.shuffle`), privacy
filters for an analyst's adaptive releases (:mod:`.odometer`) and central-DP
release mechanisms (:mod:`.central`). See docs/PRIVACY.md for what each
figure protects against."""
