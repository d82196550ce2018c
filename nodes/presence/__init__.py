"""Group presence: whether a group turn is answered (mentions, reply judges) and the round policy that skips the model when it is not."""
