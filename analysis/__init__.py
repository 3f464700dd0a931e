"""analysis: tools that read a DemoTransformer and its ActivationCache and answer questions.

Nothing here changes the model. Each tool returns plain tensors or small
dataclasses; ``analysis.plots`` turns them into plotly figures.
"""
