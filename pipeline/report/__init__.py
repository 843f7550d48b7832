"""What a person reads about a corpus: the HTML report, duplicate clusters, statistics as text, the
rejects summary and progress bars. Shared by the commands and the demo (commands are not libraries)."""
