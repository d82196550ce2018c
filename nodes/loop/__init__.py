"""The one model node: the features' round policies in order (`chain`, where each feature registers) and `call_model`, which folds them over a round."""
