import torch


class MNISTModel(torch.nn.Module):
    """fc_mnist's shape: a stack of fully connected layers; called on a batch, returns the loss."""

    def __init__(self, params):
        super().__init__()
        p = params["model"]
        layers, width = [], 784
        for _ in range(p["depth"]):
            layers += [torch.nn.Linear(width, p["hidden_size"]), torch.nn.ReLU()]
            width = p["hidden_size"]
        layers.append(torch.nn.Linear(width, 10))
        self.model = torch.nn.Sequential(torch.nn.Flatten(), *layers)

    def forward(self, batch):
        inputs, labels = batch
        return torch.nn.functional.cross_entropy(self.model(inputs.float()), labels.long())
