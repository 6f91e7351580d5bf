"""Kaggle Disaster Tweets TFDS builder (``name="disaster_tweets"``): train/validation/test from train.csv,
kaggle_test from test.csv."""
from transformer.data.disaster_tweets.disaster_tweets_dataset_builder import LABEL_NAMES, Builder
