"""egolake's algorithms: geometry, camera poses, hands, fusion, actions, retargeting.

Nothing here imports Spark, reads tables or knows file layouts; arrays in, arrays out.
"""
