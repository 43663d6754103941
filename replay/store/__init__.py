"""What a run leaves behind: the checkpoint (lock, records, state files, batch log), the output
location and its versions, the tables written besides Spark's, publication, digests and status.
"""
