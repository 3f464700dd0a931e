"""analysis: tools that read a model (a DemoTransformer or a BERT-style EncoderTransformer) and its ActivationCache.

Nothing here changes the model. Each tool returns plain tensors or small
dataclasses; ``analysis.plots`` turns them into plotly figures.
"""
